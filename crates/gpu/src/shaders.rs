//! The WGSL sources. A weight-reading kernel (matrix product, embedding sum) is one body
//! written once plus a per-format `load4` that dequantizes four consecutive weights of a row from
//! the checkpoint-format planes ([`kernels::CheckpointParts`]); the other kernels (RMS norm,
//! attention with RoPE and the KV store, gated SiLU) do not read weights in a quantized format.
//!
//! Every module is also translated to MSL and HLSL by a test (`tests/naga_targets.rs`), so a shader
//! only Metal or DX12 would reject fails here.

use crate::bindings::{declare_bindings, Access};
use crate::uniforms::{CopyParams, MatParams, Misc, SampleParams};
use crate::WeightKind;

mod layer;
mod matvec;

use layer::{ATTENTION, ATTENTION_MERGE, RMS_NORM};
pub use matvec::Fuse;
pub(crate) use matvec::MATMUL_ROWS;
use matvec::{load4, matmul_body, EMBED_BODY, MAT_SCALES};

/// Most activation rows one matrix product handles (the batch of a GPU backend).
pub const MAX_ROWS: usize = 8;

/// Layout of the per-call integer step buffer (`array<i32>`), shared with the shaders:
/// `[0]` active rows `n`; `[SESS..]` session of each active row; `[SLOT..]` KV slot written this
/// step; `[COUNT..]` entries attended; `[TOKENS..]` token columns, then the previous tokens of a
/// Depformer step.
pub(crate) mod step {
    /// Session index of active row `b` at `SESS + b`.
    pub const SESS: usize = 8;
    /// Ring slot of active row `b` at `SLOT + b`.
    pub const SLOT: usize = 16;
    /// Attended entries of active row `b` at `COUNT + b`.
    pub const COUNT: usize = 24;
    /// First token.
    pub const TOKENS: usize = 32;
}

/// Declarations every module shares: the step buffer layout and exact f16 / bf16 decoding
/// (integer arithmetic, so subnormal f16 scales are not flushed to zero by a driver).
const PRELUDE: &str = r#"
const WG: u32 = 64u;
const MAXN: u32 = 8u;
const SESS: u32 = 8u;
const SLOT: u32 = 16u;
const COUNT: u32 = 24u;

fn f16_bits_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) {
        // Zero or subnormal: m · 2^-24, exact in f32.
        let v = f32(m) * 5.9604644775390625e-8;
        return select(v, -v, sign != 0u);
    }
    if (e == 31u) {
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

fn bf16_bits_to_f32(h: u32) -> f32 {
    return bitcast<f32>(h << 16u);
}

// Half `i` of an array of 16-bit values packed two per u32 (little-endian).
fn half_at(w: u32, i: u32) -> u32 {
    return (w >> (16u * (i & 1u))) & 0xffffu;
}
"#;

/// The entry point of a kernel with one thread per value of each active row: the grid's `y` is
/// the row `b`, thread `i` along `x` runs the kernel's `body(b, i)`, which returns at once past
/// the row's count.
const PER_ROW_MAIN: &str = r#"
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    body(gid.y, gid.x);
}
"#;

/// The WGSL function `name(lid, v, is_max) -> f32`: the sum (or the maximum) of one value per
/// thread of a `width`-thread workgroup, through the workgroup array `part` by a fixed pairwise
/// tree (the same order on every device), returned to every thread. Called from uniform control
/// flow; its array is free again on return. `lead_barrier` starts it with a barrier too, for a
/// caller whose threads may still be reading `part` from before.
pub(crate) fn tree_reduce(name: &str, part: &str, width: u32, lead_barrier: bool) -> String {
    let lead = if lead_barrier {
        "\n    workgroupBarrier();"
    } else {
        ""
    };
    let half = width / 2;
    format!(
        r#"
fn {name}(lid: u32, v: f32, is_max: bool) -> f32 {{{lead}
    {part}[lid] = v;
    workgroupBarrier();
    for (var s = {half}u; s > 0u; s >>= 1u) {{
        if (lid < s) {{
            let a = {part}[lid];
            let o = {part}[lid + s];
            {part}[lid] = select(a + o, max(a, o), is_max);
        }}
        workgroupBarrier();
    }}
    let total = {part}[0];
    workgroupBarrier();
    return total;
}}
"#
    )
}

/// The tree reduction of the 64-thread kernels (the LM's RMS norm and attention), [`tree_reduce`]
/// over its own array.
fn workgroup_reduce() -> String {
    format!(
        "\nvar<workgroup> reduce_part: array<f32, 64>;\n{}",
        tree_reduce("workgroup_reduce", "reduce_part", 64, false)
    )
}

/// Every fusion of the matrix product.
const FUSES: [Fuse; 3] = [Fuse::Plain, Fuse::Norm, Fuse::NormGate];

/// What a compute module does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Module {
    /// Matrix product with weights of a format, with what it fuses (the shared-memory
    /// reduction, any device).
    Matmul(WeightKind, Fuse),
    /// The same matrix product reducing with subgroup shuffles: compiled only on a device with
    /// `wgpu::Features::SUBGROUP`, and bit for bit the same results as [`Module::Matmul`].
    MatmulSubgroup(WeightKind, Fuse),
    /// The sum of embedding rows of several tables (one matrix's rows: the LM's arena) added
    /// to the activations, with weights of a format (`shaders/matvec.rs`, `EMBED_BODY`).
    Embed(WeightKind),
    /// RMS norm.
    RmsNorm,
    /// Attention over the KV ring, split-K first pass: one key chunk of one head per workgroup
    /// (RoPE of q and k and the KV-ring store folded in).
    Attention,
    /// Attention over the KV ring, split-K merge of the chunks of each head.
    AttentionMerge,
    /// Token sampling ([`crate::sample`]).
    Sample,
    /// The bandwidth probe's copy ([`crate::BandwidthProbe`]).
    Copy,
}

impl Module {
    /// Every module the backend compiles on any device (the subgroup variants, which need a
    /// device feature, are [`Module::subgroup_variants`]).
    pub fn all() -> Vec<Module> {
        let mut v = Vec::new();
        for k in WeightKind::ALL {
            for f in FUSES {
                v.push(Module::Matmul(k, f));
            }
            v.push(Module::Embed(k));
        }
        v.extend([
            Module::RmsNorm,
            Module::Attention,
            Module::AttentionMerge,
            Module::Sample,
            Module::Copy,
        ]);
        v
    }

    /// The modules that need `wgpu::Features::SUBGROUP` (naga takes the subgroup built-ins
    /// without WGSL's `enable subgroups;`, which it does not parse yet).
    pub fn subgroup_variants() -> Vec<Module> {
        WeightKind::ALL
            .into_iter()
            .flat_map(|k| FUSES.map(|f| Module::MatmulSubgroup(k, f)))
            .collect()
    }

    /// The module's WGSL source (entry point `main`).
    pub fn source(self) -> String {
        let mat = MatParams::wgsl();
        let body = match self {
            Module::Matmul(k, f) => [PRELUDE, &mat, &matmul_body(k, false, f)].concat(),
            Module::MatmulSubgroup(k, f) => [PRELUDE, &mat, &matmul_body(k, true, f)].concat(),
            Module::Embed(k) => [
                PRELUDE,
                &mat,
                MAT_SCALES,
                &load4(k),
                EMBED_BODY,
                PER_ROW_MAIN,
            ]
            .concat(),
            Module::RmsNorm => [PRELUDE, &Misc::wgsl(), &workgroup_reduce(), RMS_NORM].concat(),
            Module::Attention => [PRELUDE, &Misc::wgsl(), &workgroup_reduce(), ATTENTION].concat(),
            Module::AttentionMerge => [PRELUDE, &Misc::wgsl(), ATTENTION_MERGE].concat(),
            Module::Sample => [&SampleParams::wgsl(), SAMPLE_WGSL].concat(),
            Module::Copy => [&CopyParams::wgsl(), COPY_WGSL].concat(),
        };
        let (uniform, buffers) = self.bindings();
        declare_bindings(self.access(), uniform, buffers) + &body
    }

    /// How the module binds its buffers (binding 0 is its uniform block).
    pub(crate) fn access(self) -> &'static [Access] {
        use Access::{Read as R, Uniform as U, Write as W};
        match self {
            Module::Matmul(..) | Module::MatmulSubgroup(..) => &[U, R, R, R, R, W, R, R],
            Module::Embed(_) => &[U, R, R, R, R, W, R],
            Module::RmsNorm => &[U, R, R, W, R],
            Module::Attention => &[U, R, W, W, W, W, R, R],
            Module::AttentionMerge => &[U, R, W, R],
            Module::Sample => &[U, R, W, W, W],
            Module::Copy => &[U, R, W],
        }
    }

    /// The WGSL name and struct of the module's uniform block, and the names and element types
    /// of its storage bindings, in the order of [`Module::access`].
    fn bindings(self) -> (&'static str, &'static str) {
        match self {
            // 16-byte loads of the codes and activations (rows of a multiple of 16 bytes: see
            // `GpuMatrix::upload`; activation offsets and strides multiples of 4).
            // `nw`: the RMS norm weights of a fused norm (any buffer otherwise).
            Module::Matmul(..) | Module::MatmulSubgroup(..) => (
                "P: MatParams",
                "codes: vec4<u32>, scales: u32, biases: u32, x: vec4<f32>, y: f32, stepb: i32, \
                 nw: vec4<f32>",
            ),
            // `map`: the entries of the sum (see `EMBED_BODY`).
            Module::Embed(_) => (
                "P: MatParams",
                "codes: u32, scales: u32, biases: u32, map: vec4<u32>, y: f32, stepb: i32",
            ),
            Module::RmsNorm => ("M: Misc", "x: f32, w: f32, dst: f32, stepb: i32"),
            Module::Attention => (
                "M: Misc",
                "qkv: f32, kc: u32, vc: u32, part: f32, dst: f32, stepb: i32, rope: f32",
            ),
            Module::AttentionMerge => ("M: Misc", "part: f32, dst: f32, stepb: i32"),
            Module::Sample => (
                "S: SampleParams",
                "logits: f32, prob: f32, rec: u32, stepb: i32",
            ),
            Module::Copy => ("C: CopyParams", "src: vec4<u32>, dst: vec4<u32>"),
        }
    }
}

/// The sampling kernel. One workgroup per active row `wid.y`, for stream `S.stream` (0 text,
/// 1 audio) over `logits[b · S.ld ..][.. S.vocab]`; writes its token at the row's cursor and into
/// the step buffer at `S.prev + b` (the next Depformer step's input).
pub(crate) const SAMPLE_WGSL: &str = r#"
const SWG: u32 = 256u;
const MAXK: u32 = 1024u;
const NONE: u32 = 0xffffffffu;
const R_STREAM: u32 = 3u;
const R_PAD_ID: u32 = 6u;
const R_PAD_MUL: u32 = 7u;
const R_PENALTY: u32 = 8u;
const R_HIST_LEN: u32 = 9u;
const R_FORCED: u32 = 10u;
const R_CURSOR: u32 = 11u;
const R_ERR: u32 = 12u;
const R_RNG: u32 = 16u;
const R_HIST: u32 = 32u;
const R_OUT: u32 = 96u;

var<workgroup> shared_word: u32;
var<workgroup> first_bad: atomic<u32>;
var<workgroup> fill: atomic<u32>;
var<workgroup> hist: array<atomic<u32>, 256>;
var<workgroup> rv: array<f32, SWG>;
var<workgroup> ri: array<u32, SWG>;
var<workgroup> cand: array<vec2<u32>, MAXK>;

// Exponent all ones: inf or NaN (a bit test, which no fast-math setting folds away).
fn is_finite(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7f800000u) != 0x7f800000u;
}

fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

// Thread 0's `v`, seen by every thread as a uniform value (branches before barriers need one).
fn share(v: u32, lid: u32) -> u32 {
    if (lid == 0u) {
        shared_word = v;
    }
    return workgroupUniformLoad(&shared_word);
}

// 64-bit words as (low, high).
fn mul_small(a: vec2<u32>, c: u32) -> vec2<u32> {
    let lo = (a.x & 0xffffu) * c;
    let hi = (a.x >> 16u) * c;
    let carry = (hi + (lo >> 16u)) >> 16u;
    return vec2<u32>(a.x * c, a.y * c + carry);
}

// Rotation left by 0 < k < 32.
fn rotl_small(a: vec2<u32>, k: u32) -> vec2<u32> {
    return vec2<u32>((a.x << k) | (a.y >> (32u - k)), (a.y << k) | (a.x >> (32u - k)));
}

fn load64(o: u32) -> vec2<u32> {
    return vec2<u32>(rec[o], rec[o + 1u]);
}

fn store64(o: u32, v: vec2<u32>) {
    rec[o] = v.x;
    rec[o + 1u] = v.y;
}

// xoshiro256** (the host's `Rng::next_u64`) on the state at rec[o .. o + 8].
fn next_u64(o: u32) -> vec2<u32> {
    var s0 = load64(o);
    var s1 = load64(o + 2u);
    var s2 = load64(o + 4u);
    var s3 = load64(o + 6u);
    let result = mul_small(rotl_small(mul_small(s1, 5u), 7u), 9u);
    let t = vec2<u32>(s1.x << 17u, (s1.y << 17u) | (s1.x >> 15u));
    s2 = s2 ^ s0;
    s3 = s3 ^ s1;
    s1 = s1 ^ s2;
    s0 = s0 ^ s3;
    s2 = s2 ^ t;
    // Rotation by 45 = swap the halves (32), then 13.
    s3 = rotl_small(vec2<u32>(s3.y, s3.x), 13u);
    store64(o, s0);
    store64(o + 2u, s1);
    store64(o + 4u, s2);
    store64(o + 6u, s3);
    return result;
}

// The row's token: at its cursor, and as the next Depformer step's input.
fn emit(b: u32, r: u32, t: u32) {
    let c = rec[r + R_CURSOR];
    rec[r + R_OUT + c] = t;
    rec[r + R_CURSOR] = c + 1u;
    stepb[S.prev + b] = i32(t);
}

// Index of the largest prob[lo ..][.. n], the first on ties (the host's `argmax`; no NaN here).
fn argmax(lo: u32, n: u32, lid: u32) -> u32 {
    var bv = bitcast<f32>(0xff800000u);
    var bi = NONE;
    for (var i = lid; i < n; i += SWG) {
        let v = prob[lo + i];
        if (bi == NONE || v > bv) {
            bv = v;
            bi = i;
        }
    }
    rv[lid] = bv;
    ri[lid] = bi;
    workgroupBarrier();
    for (var s = SWG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let v = rv[lid + s];
            let i = ri[lid + s];
            if (i != NONE && (ri[lid] == NONE || v > rv[lid] || (v == rv[lid] && i < ri[lid]))) {
                rv[lid] = v;
                ri[lid] = i;
            }
        }
        workgroupBarrier();
    }
    return share(ri[0], lid);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let b = wid.y;
    let r = b * S.stride;
    let text = S.stream == 0u;
    let n = S.vocab;
    let lo = b * S.ld;
    let cfg = r + R_STREAM * S.stream;

    // A forced text token: no check, no draw (as on the host).
    let forced = share(select(NONE, rec[r + R_FORCED], text), lid);
    if (forced != NONE) {
        if (lid == 0u) {
            emit(b, r, forced);
        }
        return;
    }

    // Copy to the work row, refusing non-finite logits (first bad index).
    if (lid == 0u) {
        atomicStore(&first_bad, NONE);
    }
    workgroupBarrier();
    for (var i = lid; i < n; i += SWG) {
        let v = logits[lo + i];
        if (!is_finite(v)) {
            atomicMin(&first_bad, i);
        }
        prob[lo + i] = v;
    }
    workgroupBarrier();
    let bad = share(atomicLoad(&first_bad), lid);
    if (bad != NONE) {
        if (lid == 0u) {
            let e = r + R_ERR + 2u * S.stream;
            if (rec[e] == NONE) {
                rec[e] = bad;
                rec[e + 1u] = bitcast<u32>(logits[lo + bad]);
            }
            emit(b, r, 0u);
        }
        return;
    }

    // Repetition penalty (text): each distinct history token once.
    let h = share(select(0u, rec[r + R_HIST_LEN], text), lid);
    if (h > 0u) {
        storageBarrier();
        if (lid < h) {
            let t = rec[r + R_HIST + lid];
            var first = t < n;
            for (var j = 0u; j < lid; j++) {
                if (rec[r + R_HIST + j] == t) {
                    first = false;
                }
            }
            if (first) {
                let pen = bitcast<f32>(rec[r + R_PENALTY]);
                let l = prob[lo + t];
                prob[lo + t] = select(l * pen, l / pen, l >= 0.0);
            }
        }
    }
    storageBarrier();

    if (share(rec[cfg], lid) != 0u) {
        let t = argmax(lo, n, lid);
        if (lid == 0u) {
            emit(b, r, t);
        }
        return;
    }

    // Softmax of logits / temperature (max-subtracted), as the host computes it.
    let inv_t = bitcast<f32>(rec[cfg + 1u]);
    var mx = bitcast<f32>(0xff800000u);
    for (var i = lid; i < n; i += SWG) {
        let v = prob[lo + i] * inv_t;
        prob[lo + i] = v;
        mx = max(mx, v);
    }
    rv[lid] = mx;
    workgroupBarrier();
    for (var s = SWG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            rv[lid] = max(rv[lid], rv[lid + s]);
        }
        workgroupBarrier();
    }
    let m = bitcast<f32>(share(bitcast<u32>(rv[0]), lid));
    storageBarrier();
    if (!is_finite(m)) {
        let t = argmax(lo, n, lid);
        if (lid == 0u) {
            emit(b, r, t);
        }
        return;
    }
    var sum = 0.0;
    for (var i = lid; i < n; i += SWG) {
        var e = exp(prob[lo + i] - m);
        if (is_nan(e)) {
            e = 0.0;
        }
        prob[lo + i] = e;
        sum += e;
    }
    rv[lid] = sum;
    workgroupBarrier();
    for (var s = SWG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            rv[lid] += rv[lid + s];
        }
        workgroupBarrier();
    }
    let inv_sum = 1.0 / rv[0];
    for (var i = lid; i < n; i += SWG) {
        prob[lo + i] = prob[lo + i] * inv_sum;
    }
    storageBarrier();
    if (lid == 0u && text) {
        let pad = rec[r + R_PAD_ID];
        if (pad < n) {
            prob[lo + pad] = prob[lo + pad] * bitcast<f32>(rec[r + R_PAD_MUL]);
        }
    }
    storageBarrier();

    // The k-th largest key (probabilities are >= 0, so their bits order as u32), 8 bits a pass:
    // `prefix` is its key and `need` how many of the entries equal to it are candidates.
    let k = share(rec[cfg + 2u], lid);
    var prefix = 0u;
    var mask = 0u;
    var need = k;
    for (var digit = 0u; digit < 4u; digit++) {
        let shift = 24u - 8u * digit;
        atomicStore(&hist[lid], 0u);
        workgroupBarrier();
        for (var i = lid; i < n; i += SWG) {
            let key = bitcast<u32>(prob[lo + i]);
            if ((key & mask) == prefix) {
                atomicAdd(&hist[(key >> shift) & 255u], 1u);
            }
        }
        workgroupBarrier();
        if (lid == 0u) {
            var d = 255u;
            var left = need;
            loop {
                let c = atomicLoad(&hist[d]);
                if (c >= left || d == 0u) {
                    break;
                }
                left -= c;
                d -= 1u;
            }
            ri[0] = prefix | (d << shift);
            ri[1] = left;
        }
        workgroupBarrier();
        prefix = ri[0];
        need = ri[1];
        mask = mask | (255u << shift);
        workgroupBarrier();
    }

    // Candidates: every key above `prefix`, and the `need` lowest indices among those equal to it
    // (contiguous chunks per thread, so a tie's rank is the ties of the chunks before plus its own).
    let chunk = (n + SWG - 1u) / SWG;
    let c0 = min(n, lid * chunk);
    let c1 = min(n, c0 + chunk);
    var ties = 0u;
    for (var i = c0; i < c1; i++) {
        if (bitcast<u32>(prob[lo + i]) == prefix) {
            ties++;
        }
    }
    ri[lid] = ties;
    if (lid == 0u) {
        atomicStore(&fill, 0u);
    }
    workgroupBarrier();
    var rank = 0u;
    for (var j = 0u; j < lid; j++) {
        rank += ri[j];
    }
    for (var i = c0; i < c1; i++) {
        let key = bitcast<u32>(prob[lo + i]);
        var take = key > prefix;
        if (key == prefix) {
            take = rank < need;
            rank++;
        }
        if (take) {
            let slot = atomicAdd(&fill, 1u);
            cand[slot] = vec2<u32>(key, i);
        }
    }
    workgroupBarrier();

    // Bitonic sort: descending probability, ascending index (the host's candidate order).
    var p2 = 1u;
    while (p2 < k) {
        p2 <<= 1u;
    }
    for (var i = k + lid; i < p2; i += SWG) {
        cand[i] = vec2<u32>(0u, NONE);
    }
    workgroupBarrier();
    for (var size = 2u; size <= p2; size <<= 1u) {
        for (var stride = size >> 1u; stride > 0u; stride >>= 1u) {
            for (var i = lid; i < p2; i += SWG) {
                let j = i ^ stride;
                if (j > i) {
                    let a = cand[i];
                    let c = cand[j];
                    let a_first = a.x > c.x || (a.x == c.x && a.y < c.y);
                    if (a_first != ((i & size) == 0u)) {
                        cand[i] = c;
                        cand[j] = a;
                    }
                }
            }
            workgroupBarrier();
        }
    }

    // One draw: the first candidate whose running sum exceeds u · total.
    if (lid == 0u) {
        var total = 0.0;
        for (var j = 0u; j < k; j++) {
            total += bitcast<f32>(cand[j].x);
        }
        var t = cand[0].y;
        if (is_finite(total) && total > 0.0) {
            let x = next_u64(r + R_RNG + 8u * S.stream);
            let u = f32(x.y >> 8u) * 5.9604644775390625e-8;
            let goal = u * total;
            var acc = 0.0;
            t = cand[k - 1u].y;
            for (var j = 0u; j < k; j++) {
                acc += bitcast<f32>(cand[j].x);
                if (acc > goal) {
                    t = cand[j].y;
                    break;
                }
            }
        }
        emit(b, r, t);
    }
}
"#;

/// The copy kernel: `dst[i] = src[i]` over `C.n` 16-byte words.
pub(crate) const COPY_WGSL: &str = r#"
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let stride = nwg.x * 256u;
    for (var i = gid.x; i < C.n; i += stride) {
        dst[i] = src[i];
    }
}
"#;
