//! The weight-reading kernels: the matrix product (matvec over the step's `n ≤ 8` rows) and the
//! embedding sum (one body over a per-format `load4`: a few rows per token row, it stays simple;
//! its arithmetic is in `lm/embed.rs`).
//!
//! # The matvec
//!
//! A decoding step multiplies each weight matrix by at most 8 activation rows, so the kernel is
//! bound by reading the weights once: the design goal is to stream the codes plane at the
//! memory's bandwidth with few instructions per byte.
//!
//! * **Rows per workgroup.** A team of 32 lanes computes one weight row; a workgroup of 256
//!   invocations holds 8 teams, so a chunk of `rows` launches `⌈rows/8⌉` workgroups (folded to
//!   2-D by [`crate::dispatch::Grid::Rows`]); the old kernel launched one 64-invocation workgroup
//!   per row (≈2 M per LM frame) with a 7-barrier tree each.
//! * **Wide loads.** The codes plane is bound as `array<vec4<u32>>`: a lane reads 16 bytes per
//!   load, and the 32 lanes of a team read 512 contiguous bytes. One lane's *step* is a whole
//!   unit of the format: 4 f32 values, 8 f16/bf16 values, one q8_0 block (32 bytes, two loads)
//!   or q4_0 block (16 bytes), 32 values of an MLX group (16 or 32 bytes); the block's scale
//!   (and MLX bias) is read once per step. Rows are padded to 16 bytes at upload (only f16/bf16
//!   rows of `cols ≡ 4 mod 8` need it; their half-filled last step masks its activations).
//! * **Scales factored.** q8_0/q4_0 sum `q·x` over the block and multiply by the scale once
//!   (exact factorisation of `Σ (s·q)·x`); MLX affine weights are dequantized per value
//!   (`s·q + b`, as the CPU does: factoring the bias would cancel badly).
//! * **Activations** are read as `vec4<f32>` straight from global memory: every team of every
//!   workgroup reads the same `n` rows, which stay in L1/L2 (4096 f32 = 16 KiB per row). Shared
//!   memory would not hold them at `n = 8` (128 KiB against the 48 KiB a workgroup typically
//!   gets) and, at `n = 1`, would cost a barrier and a copy for the same on-chip bandwidth.
//! * **No runtime-indexed private arrays.** The 8 accumulators are 8 named variables, the
//!   per-row code unrolled by the generator ([`matmul_body`]); row `b`'s block runs when
//!   `b < n` (a uniform branch), so a row's arithmetic does not depend on `n`.
//! * **Reduction.** A fixed pairwise tree over the 32 lanes, low strides first. With
//!   `wgpu::Features::SUBGROUP` ([`crate::shaders::Module::MatmulSubgroup`]) the strides inside
//!   a subgroup are subgroup shuffles (all five on a 32- or 64-wide subgroup) and only the rest
//!   goes through the shared array; without it ([`crate::shaders::Module::Matmul`]) one
//!   invocation per (row, batch row) finishes the tree in shared memory after one barrier. The
//!   tree is the same, so both paths give the same bits, on every subgroup size.
//!
//! # Fusions ([`Fuse`])
//!
//! A layer is `x += out_proj(attn(in_proj(norm1 x))); x += lin_out(gate(lin_in(norm2 x)))`.
//! The residual adds are the epilogues of `out_proj` and `lin_out` (`P.accumulate`). The RMS
//! norms are prologues of `in_proj` and `lin_in` ([`Fuse::Norm`]): every workgroup sums the
//! squares of its `n` activation rows itself (256 invocations, a fixed 256-wide tree) and loads
//! `x · (w · inv)`, the CPU's grouping. That costs each workgroup `n · cols · 4` bytes from L2
//! (16 KiB at d = 4096): 1536 × 16 KiB = 25 MB for `in_proj`, 2816 × 16 KiB = 46 MB for
//! `lin_in`, about 2.5 and 4.6 µs of an H200's ~10 TB/s L2 spread over the SMs and overlapped
//! with other workgroups' weight streams, against ~24 µs measured for each one-workgroup
//! `RmsNorm` launch it replaces (latency-bound: 64 serial loads per invocation, twice). The
//! gated SiLU is `lin_in`'s epilogue ([`Fuse::NormGate`]): its rows are interleaved at upload
//! (`a_j`, `g_j` adjacent, in one workgroup), so the workgroup writes `silu(a_j) · g_j` and
//! nothing else: the `2·hidden` intermediate is never stored. Per frame that removes 2 norm
//! launches and 1 gate launch per layer: 32 × 3 = 96 temporal and 8 × 6 × 3 = 144 Depformer,
//! **724 → 484 launches** (the final norm, read back as `transformer_out`, stays a launch); the
//! embedding sum of the temporal step's 17 tables in one launch (`lm/embed.rs`) makes it 468.
//!
//! # Arithmetic at Moshi's shapes (`n = 1`, 3.3 TB/s)
//!
//! Bytes per weight: f32 4, f16/bf16 2, q8_0 1.0625, q4_0 0.5625, MLX 4-bit (group 64) 0.5625,
//! MLX 8-bit (group 64) 1.0625. Time = weight bytes / 3.3 TB/s (activations come from cache).
//!
//! | matrix | rows × cols | workgroups | q8_0 | q4_0 | bf16 | f32 |
//! |---|---|---|---|---|---|---|
//! | `out_proj` | 4096 × 4096 | 512 | 17.8 MB, 5.4 µs | 9.4 MB, 2.9 µs | 33.6 MB, 10.2 µs | 67 MB, 20 µs |
//! | `in_proj` | 12288 × 4096 | 1536 | 53.5 MB, 16.2 µs | 28.3 MB, 8.6 µs | 101 MB, 30.5 µs | 201 MB, 61 µs |
//! | `lin_in` | 22528 × 4096 | 2816 | 98.0 MB, 29.7 µs | 51.9 MB, 15.7 µs | 185 MB, 55.9 µs | 369 MB, 112 µs |
//! | `lin_out` | 4096 × 11264 | 512 | 49.0 MB, 14.9 µs | 26.0 MB, 7.9 µs | 92 MB, 28.0 µs | 185 MB, 56 µs |
//! | text head | 32000 × 4096 | 4000 | 139 MB, 42.2 µs | 73.7 MB, 22.3 µs | 262 MB, 79.4 µs | 524 MB, 159 µs |
//! | Depformer `out_proj` | 1024 × 1024 | 128 | 1.1 MB, 0.3 µs | 0.6 MB, 0.2 µs | 2.1 MB, 0.6 µs | 4.2 MB, 1.3 µs |
//!
//! A temporal layer at q8_0 moves 218 MB (66 µs), the 32 layers 2.1 ms. Each lane of a 4096-
//! column q8_0 row runs 4 steps (128 blocks / 32 lanes), of `lin_out` 11; the Depformer's
//! 1024-column rows one, so its small matrices are bound by launch latency, not bytes.
//! Activation traffic from cache per row is `n · cols · 4` bytes (16 KiB at `n = 1`, 4096
//! columns: 3.8× the q8_0 row, read from L1 at ~10× the DRAM bandwidth); at `n = 8` it is 30×
//! the q8_0 row and the kernel becomes cache-bound, the next thing to fix for batched serving
//! (several rows per team reusing each activation load, or activations staged as f16).
//! Instruction count per weight at `n = 1`: q4_0 about 5 (shift, mask, convert, subtract, FMA):
//! at 3.3 TB/s that is ~30 T instructions/s against the H200's ~33 T lane-instructions/s, so
//! q4_0 is near the ALU limit even at one row; q8_0 needs ~4 per weight at half the rate.

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
    let i = r * P.ld_w + 4u * k;
    return vec4<f32>(bitcast<f32>(codes[i]), bitcast<f32>(codes[i + 1u]),
                     bitcast<f32>(codes[i + 2u]), bitcast<f32>(codes[i + 3u]));"#
        }
        // Two 16-bit values per word, low half first, decoded by the format's `half_to_f32`.
        WeightKind::F16 | WeightKind::Bf16 => {
            r#"
    let i = r * P.ld_w + 2u * k;
    let a = codes[i];
    let b = codes[i + 1u];
    return vec4<f32>(half_to_f32(a & 0xffffu), half_to_f32(a >> 16u),
                     half_to_f32(b & 0xffffu), half_to_f32(b >> 16u));"#
        }
        WeightKind::Q8_0 => {
            r#"
    // Sign-extend each byte with an arithmetic shift (no extractBits: MSL before 1.2 lacks it).
    let w = codes[r * P.ld_w + k];
    let q = vec4<f32>(f32(bitcast<i32>(w << 24u) >> 24u), f32(bitcast<i32>(w << 16u) >> 24u),
                      f32(bitcast<i32>(w << 8u) >> 24u), f32(bitcast<i32>(w) >> 24u));
    return f16_bits_to_f32(scale_of(r, k)) * q;"#
        }
        // Per 32-value block, 4 words; byte j holds value j (low nibble) and j + 16 (high).
        WeightKind::Q4_0 => {
            r#"
    let m = k & 7u;
    let w = codes[r * P.ld_w + (k >> 3u) * 4u + (m & 3u)];
    let sh = select(0u, 4u, m >= 4u);
    let q = vec4<f32>(f32((w >> sh) & 15u), f32((w >> (8u + sh)) & 15u),
                      f32((w >> (16u + sh)) & 15u), f32((w >> (24u + sh)) & 15u));
    return f16_bits_to_f32(scale_of(r, k)) * (q - vec4<f32>(8.0));"#
        }
        // Eight values per word, low bits first.
        WeightKind::Mlx4 => {
            r#"
    let w = codes[r * P.ld_w + (k >> 1u)] >> (16u * (k & 1u));
    let q = vec4<f32>(f32(w & 15u), f32((w >> 4u) & 15u), f32((w >> 8u) & 15u), f32((w >> 12u) & 15u));
    return bf16_bits_to_f32(scale_of(r, k)) * q + vec4<f32>(bf16_bits_to_f32(bias_of(r, k)));"#
        }
        WeightKind::Mlx8 => {
            r#"
    let w = codes[r * P.ld_w + k];
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

/// What a matrix product fuses around `y = W x`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fuse {
    /// The product alone (`y (+)= W x`).
    Plain,
    /// `y = W · rms_norm(x)`: each workgroup computes the rows' norms itself and scales the
    /// activations as it loads them (the norm's weights at `P.norm_off` of `nw`).
    Norm,
    /// [`Fuse::Norm`], then the gated SiLU of the FFN as the epilogue: the matrix's rows
    /// interleaved as `a_0, g_0, a_1, g_1, ..` at upload, `y[j] = silu(a_j) · g_j`.
    NormGate,
}

/// Weight rows per matmul workgroup: one 32-lane team per row, 8 teams in 256 invocations.
pub(crate) const MATMUL_ROWS: u32 = 8;

/// Lanes of a team (one weight row). Fixed, whatever the device's subgroup size, so that the
/// reduction order (and so every bit of the result) is the same on every device and path.
const TEAM: u32 = 32;

/// How one format's matmul step reads the codes plane: `nv` dequantized `vec4<f32>` (`w0 ..`) of
/// `4·nv` consecutive values of the row per step; `scaled` when the step's sum is multiplied by a
/// block scale `sc` afterwards (q8_0, q4_0: `Σ s·q·x = s·Σ q·x`, exact factorisation); `load` the
/// WGSL that defines them from `s` (the step), `r` (the row in the chunk) and `wr` (the row's
/// first `vec4<u32>` in `codes`); `steps` the WGSL count of steps in a row.
struct StepFormat {
    nv: usize,
    scaled: bool,
    load: String,
    steps: &'static str,
    /// Steps whose second `vec4` lies past `P.cols` (f16/bf16 rows of `cols ≡ 4 mod 8`, padded
    /// with zero codes at upload): their activations are masked, so an `inf` beyond the row's
    /// end cannot make a NaN.
    half_tail: bool,
}

/// The step's codes in one 16-byte load `c`.
const ONE_LOAD: &str = "let c = codes[wr + s];";

/// The step's codes in two 16-byte loads `c0`, `c1`.
const TWO_LOADS: &str = r#"let c0 = codes[wr + 2u * s];
            let c1 = codes[wr + 2u * s + 1u];"#;

/// The words of one load (`c`) and of two (`c0`, `c1`), in memory order.
const WORDS: [&str; 4] = ["c.x", "c.y", "c.z", "c.w"];
const WORDS2: [&str; 8] = [
    "c0.x", "c0.y", "c0.z", "c0.w", "c1.x", "c1.y", "c1.z", "c1.w",
];

/// The f16 scale `sc` of a 32-value block (q8_0, q4_0: one block per step).
const BLOCK_SCALE: &str = r#"let blk = r * (P.cols / 32u) + s;
            let sc = f16_bits_to_f32(half_at(scales[blk >> 1u], blk));"#;

/// The bf16 scale `sa` and bias `bi` of the MLX group holding the step's 32 values.
const GROUP_AFFINE: &str = r#"let g = r * (P.cols / P.group) + (32u * s) / P.group;
            let sa = vec4<f32>(bf16_bits_to_f32(half_at(scales[g >> 1u], g)));
            let bi = vec4<f32>(bf16_bits_to_f32(half_at(biases[g >> 1u], g)));"#;

/// The eight `w{k}` of a 32-value step: `unpack(k)` names the [`UNPACK`] function and the word
/// that hold values `4k .. 4k + 3`; MLX's affine groups then apply `sa * q + bi` per value.
fn unpack8(unpack: impl Fn(usize) -> (&'static str, &'static str), affine: bool) -> String {
    let lines: Vec<String> = (0..8)
        .map(|k| {
            let (f, word) = unpack(k);
            if affine {
                format!("let w{k} = sa * {f}({word}) + bi;")
            } else {
                format!("let w{k} = {f}({word});")
            }
        })
        .collect();
    lines.join("\n            ")
}

/// A format of one 32-value block or group per step: its loads, then `w0 .. w7`, with the block
/// scale after them (`scaled`) or the group's scale and bias before them (MLX).
fn step32(
    loads: &str,
    unpack: impl Fn(usize) -> (&'static str, &'static str),
    scaled: bool,
) -> StepFormat {
    let ws = unpack8(unpack, !scaled);
    let load = if scaled {
        format!("{loads}\n            {ws}\n            {BLOCK_SCALE}")
    } else {
        format!("{loads}\n            {GROUP_AFFINE}\n            {ws}")
    };
    StepFormat {
        nv: 8,
        scaled,
        load,
        steps: "P.cols / 32u",
        half_tail: false,
    }
}

/// A 16-bit format's step: 8 values from one 16-byte load `c`, `w0` and `w1` defined by
/// `unpack`; a row of `cols ≡ 4 mod 8` ends in a half step.
fn step16(unpack: &str) -> StepFormat {
    StepFormat {
        nv: 2,
        scaled: false,
        load: format!("{ONE_LOAD}\n            {unpack}"),
        steps: "(P.cols + 7u) / 8u",
        half_tail: true,
    }
}

fn step_format(kind: WeightKind) -> StepFormat {
    match kind {
        // 16 bytes: 4 values.
        WeightKind::F32 => StepFormat {
            nv: 1,
            scaled: false,
            load: "let w0 = bitcast<vec4<f32>>(codes[wr + s]);".into(),
            steps: "P.cols / 4u",
            half_tail: false,
        },
        // 16 bytes: 8 values, low half of each word first.
        WeightKind::F16 => step16(
            r#"let w0 = vec4<f32>(f16_bits_to_f32(c.x & 0xffffu), f16_bits_to_f32(c.x >> 16u),
                               f16_bits_to_f32(c.y & 0xffffu), f16_bits_to_f32(c.y >> 16u));
            let w1 = vec4<f32>(f16_bits_to_f32(c.z & 0xffffu), f16_bits_to_f32(c.z >> 16u),
                               f16_bits_to_f32(c.w & 0xffffu), f16_bits_to_f32(c.w >> 16u));"#,
        ),
        // bf16 is the high half of an f32: a shift or a mask per value.
        WeightKind::Bf16 => step16(
            r#"let w0 = bitcast<vec4<f32>>(vec4<u32>(c.x << 16u, c.x & 0xffff0000u, c.y << 16u, c.y & 0xffff0000u));
            let w1 = bitcast<vec4<f32>>(vec4<u32>(c.z << 16u, c.z & 0xffff0000u, c.w << 16u, c.w & 0xffff0000u));"#,
        ),
        // One 32-value block per step: 32 code bytes (two 16-byte loads), one f16 scale.
        WeightKind::Q8_0 => step32(TWO_LOADS, |k| ("i8x4", WORDS2[k]), true),
        // One 32-value block per step: 16 code bytes (byte j: value j low, j + 16 high), so the
        // low nibbles of the four words, then their high nibbles.
        WeightKind::Q4_0 => step32(
            ONE_LOAD,
            |k| (if k < 4 { "lo4" } else { "hi4" }, WORDS[k % 4]),
            true,
        ),
        // 32 values per step (16 bytes, eight per word, low bits first) inside one group (groups
        // are multiples of 32); `s·q + b` per value, as the CPU dequantizes (no factorisation:
        // `s·Σq·x + b·Σx` would cancel where `s·q ≈ −b`).
        WeightKind::Mlx4 => step32(
            ONE_LOAD,
            |k| (if k % 2 == 0 { "nib_lo" } else { "nib_hi" }, WORDS[k / 2]),
            false,
        ),
        // 32 values per step (two 16-byte loads, four per word).
        WeightKind::Mlx8 => step32(TWO_LOADS, |k| ("u8x4", WORDS2[k]), false),
    }
}

/// Byte unpacking shared by the quantized formats (arithmetic shifts sign-extend q8_0's bytes;
/// no `extractBits`, which MSL before 1.2 lacks).
const UNPACK: &str = r#"
fn i8x4(w: u32) -> vec4<f32> {
    let v = vec4<u32>(w << 24u, w << 16u, w << 8u, w);
    return vec4<f32>(bitcast<vec4<i32>>(v) >> vec4<u32>(24u));
}
fn u8x4(w: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(w, w >> 8u, w >> 16u, w >> 24u)) & vec4<u32>(255u));
}
fn lo4(w: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(w, w >> 8u, w >> 16u, w >> 24u)) & vec4<u32>(15u)) - vec4<f32>(8.0);
}
fn hi4(w: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(w >> 4u, w >> 12u, w >> 20u, w >> 28u)) & vec4<u32>(15u)) - vec4<f32>(8.0);
}
fn nib_lo(w: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(w, w >> 4u, w >> 8u, w >> 12u)) & vec4<u32>(15u));
}
fn nib_hi(w: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(w >> 16u, w >> 20u, w >> 24u, w >> 28u)) & vec4<u32>(15u));
}
"#;

/// The matrix product `y[b, y_off + row0 + r] (+)= Σ_c W[r, c] · x[b, x_off + c]` for the
/// chunk's rows `r` and the step's `n ≤ 8` activation rows (see the module docs for the design),
/// `subgroups` selecting the subgroup-shuffle reduction.
pub(super) fn matmul_body(kind: WeightKind, subgroups: bool, fuse: Fuse) -> String {
    use std::fmt::Write;
    let f = step_format(kind);
    let norm = matches!(fuse, Fuse::Norm | Fuse::NormGate);
    let maxn = crate::shaders::MAX_ROWS;
    let mut s = String::new();
    s.push_str(UNPACK);
    let _ = write!(
        s,
        r#"
const TEAM: u32 = {TEAM}u;
const TEAMS: u32 = {MATMUL_ROWS}u;
var<workgroup> red: array<f32, {red}>;

@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32{sg_args}) {{
{linear}
    let team = t / TEAM;
    let lane = t % TEAM;
    let wg = wid.x + wid.y * nwg.x;
    let r = wg * TEAMS + team;
    let n = min(u32(stepb[0]), MAXN);
"#,
        red = TEAM as usize * MATMUL_ROWS as usize * maxn,
        wg = TEAM * MATMUL_ROWS,
        sg_args = if subgroups {
            ",\n        @builtin(subgroup_size) sgs: u32, @builtin(subgroup_id) sgid: u32,\n        \
             @builtin(subgroup_invocation_id) sid: u32"
        } else {
            ""
        },
        // The team and lane follow the subgroups (a team lies inside one subgroup, or spans
        // whole ones), whatever order the device numbers invocations in.
        linear = if subgroups {
            "    let t = sgid * sgs + sid;"
        } else {
            "    let t = lid;"
        },
    );
    for b in 0..maxn {
        let _ = writeln!(s, "    let xb{b} = ({b}u * P.ld_x + P.x_off) / 4u;");
    }
    if norm {
        s.push_str(&norm_prologue(maxn));
    }
    for b in 0..maxn {
        let _ = writeln!(s, "    var acc{b} = 0.0;");
    }
    s.push_str("    if (r < P.rows) {\n        let wr = r * (P.ld_w / 4u);\n");
    let _ = write!(
        s,
        "        let steps = {steps};\n        for (var s = lane; s < steps; s += TEAM) {{\n            {load}\n",
        steps = f.steps,
        load = f.load
    );
    if f.half_tail {
        s.push_str("            let tail = 8u * s + 4u >= P.cols;\n");
    }
    if norm {
        // The norm's weights of this step's columns, read once for all rows.
        let _ = writeln!(s, "            let no = P.norm_off / 4u + {}u * s;", f.nv);
        for k in 0..f.nv {
            let _ = writeln!(s, "            let nw{k} = nw[no + {k}u];");
        }
    }
    for b in 0..maxn {
        let _ = writeln!(s, "            if (n > {b}u) {{");
        let _ = writeln!(s, "                let xo = xb{b} + {}u * s;", f.nv);
        let mut terms = Vec::new();
        for k in 0..f.nv {
            let xk = if k == 0 {
                "x[xo]".to_string()
            } else {
                format!("x[xo + {k}u]")
            };
            // The CPU's grouping of the norm: `x · (w · inv)`.
            let xk = if norm {
                format!("{xk} * (nw{k} * inv{b})")
            } else {
                xk
            };
            let xk = if f.half_tail && k == 1 {
                format!("select({xk}, vec4<f32>(0.0), tail)")
            } else {
                xk
            };
            terms.push(format!("dot(w{k}, {xk})"));
        }
        let sum = terms.join(" + ");
        if f.scaled {
            let _ = writeln!(s, "                acc{b} = acc{b} + sc * ({sum});");
        } else {
            let _ = writeln!(s, "                acc{b} = acc{b} + ({sum});");
        }
        s.push_str("            }\n");
    }
    s.push_str("        }\n    }\n");
    // The reduction: a pairwise tree over the team's 32 lanes, low strides first (lane i adds
    // lane i + m for i a multiple of 2m). Subgroup shuffles do the strides inside a subgroup, the
    // shared array the rest; the tree is the same either way, so both paths give the same bits.
    if subgroups {
        s.push_str(
            "    let width = min(sgs, TEAM);\n    for (var m = 1u; m < width; m <<= 1u) {\n",
        );
        for b in 0..maxn {
            let _ = writeln!(
                s,
                "        acc{b} = acc{b} + subgroupShuffleXor(acc{b}, m);"
            );
        }
        s.push_str("    }\n");
    } else {
        s.push_str("    let width = 1u;\n");
    }
    for b in 0..maxn {
        let _ = writeln!(s, "    red[(team * MAXN + {b}u) * TEAM + lane] = acc{b};");
    }
    s.push_str(
        r#"    workgroupBarrier();
    if (lid < TEAMS * MAXN) {
        let tm = lid / MAXN;
        let b = lid % MAXN;
        let rr = wg * TEAMS + tm;
        if (rr < P.rows && b < n) {
            let base = (tm * MAXN + b) * TEAM;
            for (var m = width; m < TEAM; m <<= 1u) {
                for (var i = 0u; i < TEAM; i += 2u * m) {
                    red[base + i] = red[base + i] + red[base + i + m];
                }
            }
"#,
    );
    if fuse == Fuse::NormGate {
        // Rows come in pairs (`a_j`, `g_j`: see `GpuMatrix::upload_gated`); the pair's second
        // team finishes its sum before the first reads it.
        s.push_str(
            r#"        }
    }
    workgroupBarrier();
    if (lid < TEAMS / 2u * MAXN) {
        let pr = lid / MAXN;
        let b = lid % MAXN;
        let rr = wg * TEAMS + 2u * pr;
        if (rr + 1u < P.rows && b < n) {
            let a = red[(2u * pr * MAXN + b) * TEAM];
            let g = red[((2u * pr + 1u) * MAXN + b) * TEAM];
            // The CPU's `silu_gate`: a / (1 + e^-a) · g.
            y[b * P.ld_y + P.y_off + (P.row0 + rr) / 2u] = a / (1.0 + exp(-a)) * g;
        }
    }
}
"#,
        );
    } else {
        s.push_str(
            r#"            let o = b * P.ld_y + P.y_off + P.row0 + rr;
            var v = red[base];
            if (P.accumulate != 0u) {
                v = y[o] + v;
            }
            y[o] = v;
        }
    }
}
"#,
        );
    }
    s
}

/// The RMS norm prologue: `inv{b} = 1/√(mean(x_b²) + eps)` of each active row over `P.cols`
/// values, every workgroup computing it for itself (the rows are 16 KiB at d = 4096, read from
/// L2; one launch fewer per norm, no workgroup waiting on another). A fixed 256-wide tree in the
/// shared array, numbered by `lid` on both reduction paths (its bits do not depend on the
/// subgroup size); rows past `n` sum zeros, so every barrier stays in uniform control flow.
fn norm_prologue(maxn: usize) -> String {
    use std::fmt::Write;
    let wg = TEAM * MATMUL_ROWS;
    let mut s = String::new();
    for b in 0..maxn {
        let _ = write!(
            s,
            r#"    var ss{b} = 0.0;
    if (n > {b}u) {{
        for (var i = lid; i < P.cols / 4u; i += {wg}u) {{
            let v = x[xb{b} + i];
            ss{b} += dot(v, v);
        }}
    }}
    red[{b}u * {wg}u + lid] = ss{b};
"#
        );
    }
    let _ = write!(
        s,
        r#"    workgroupBarrier();
    for (var st = {half}u; st > 0u; st >>= 1u) {{
        if (lid < st) {{
            for (var b = 0u; b < MAXN; b++) {{
                red[b * {wg}u + lid] += red[b * {wg}u + lid + st];
            }}
        }}
        workgroupBarrier();
    }}
"#,
        half = wg / 2
    );
    for b in 0..maxn {
        let _ = writeln!(
            s,
            "    let inv{b} = 1.0 / sqrt(red[{b}u * {wg}u] / f32(P.cols) + P.eps);"
        );
    }
    // Every invocation has its factors before the array is reused by the reduction.
    s.push_str(
        "    workgroupBarrier();
",
    );
    s
}

/// The embedding sum `y[b, y_off + c] += Σ_e table_e[token_e(b)][c]` for the step's `n` rows,
/// over the entries of `map` in order (the CPU adds the tables one after another in that order,
/// so each value sees the same additions). `map[0].x` is the entry count; entry `e` is
/// `map[1 + e]` = (first row of its table in the bound planes, the table's rows, the step-buffer
/// index of row 0's token, the index stride per row). The tables of one launch are rows of one
/// matrix (the LM's embedding arena); an entry adds only when its row lies in this chunk
/// (`row0 .. row0 + rows`), so the chunks of a split arena, launched in order, add each entry
/// once. Token −1 adds nothing, other negative tokens read row 0, a token past its table nothing
/// (the host has rejected those). `y` is read once and written once per value.
pub(super) const EMBED_BODY: &str = r#"
fn body(b: u32, k: u32) {
    let n = min(u32(stepb[0]), MAXN);
    if (b >= n || k >= P.cols / 4u) {
        return;
    }
    let o = b * P.ld_y + P.y_off + 4u * k;
    var acc = vec4<f32>(y[o], y[o + 1u], y[o + 2u], y[o + 3u]);
    let count = map[0].x;
    for (var e = 0u; e < count; e++) {
        let m = map[1u + e];
        let t = stepb[m.z + b * m.w];
        let tok = u32(max(t, 0));
        let row = m.x + tok;
        if (t != -1 && tok < m.y && row >= P.row0 && row < P.row0 + P.rows) {
            acc = acc + load4(row - P.row0, k);
        }
    }
    y[o] = acc.x;
    y[o + 1u] = acc.y;
    y[o + 2u] = acc.z;
    y[o + 3u] = acc.w;
}
"#;
