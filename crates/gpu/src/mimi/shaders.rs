//! The WGSL kernels of Mimi on the device (the kernels' text is in `wgsl_conv` and `wgsl_codec`;
//! this module puts a module together). Activations are f32; SEANet tensors are channel-major
//! `[C, T]`, transformer tensors row-major `[T, d]`. Every kernel takes its sizes from a uniform
//! block of at most [`UNIFORM_WORDS`] words written once at load (each kernel declares its own
//! fields, [`MimiKernel::params`]), so a frame records the same launches over the same bind
//! groups.
//!
//! # The slot dimension
//!
//! Every kernel runs for all the slots listed in a call at once. Each per-slot buffer (state,
//! work buffers, inputs, outputs, counters) holds one region per slot; the weights one region
//! that all slots read. A launch's uniform block carries, after the kernel's own fields, the
//! slot stride of each of its storage bindings (0 for the weights), and its last binding is the
//! call's slot list `[n, slot₀, …]`, written once per call. A grid-launched kernel's grid is its
//! own x times `n`, the slots innermost, so that the `n` workgroups that read the same weight
//! rows are launched side by side and the weights come from memory once per call (from the
//! cache for the other slots); a kernel with a thread per output (small weights, activations
//! dominate) gets one layer of z per listed slot. The kernels are written for one slot:
//! [`offset_by_slot`] adds the slot's offset to every index into a storage binding when the
//! module is built, so no access can miss it, and a slot left out of a call is not touched.
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
//! # Per call of `n` slots (the slot dimension), at Mimi's shapes
//!
//! A call launches the same ~205 kernels (112 encoder, 93 decoder) whatever `n`, each with `n`
//! times the workgroups of the table above, and reads the 333 MB of weights once. What grows
//! with `n` is each slot's own traffic: its K/V rings read by attention (8 layers × 2
//! directions × K and V × 250 × 512 × 4 B = 16.4 MB at full context) and its SEANet
//! activations (about 7.0 MB per direction, counted conv by conv: inputs read, outputs and
//! their ELU written), about 30 MB per slot in all.
//!
//! | slots | launches | bytes per call | at 3.3 TB/s | before (each slot's launches in turn) |
//! |---|---|---|---|---|
//! | 1 | 205 | 333 + 30 = 363 MB | 110 µs | 205 launches, 363 MB |
//! | 8 | 205 | 333 + 8 × 30 = 576 MB | 175 µs | 1640 launches, 2.9 GB (880 µs) |
//!
//! The bytes are a small part of a call: on the H200, one slot's encode + decode took 3.64 ms
//! for 205 launches (BENCHMARKS.md, "issue 28's kernels"), ~18 µs a launch, and 4 slots
//! recorded in turn 13.6 ms (3.74×). With one launch per kernel per call, 8 slots should cost
//! one slot's launches plus 0.07 ms of bytes plus the extra workgroups' arithmetic (the
//! attention and the thread-per-output convolutions scale with `n`): an estimate of 1.2–2× one
//! slot, not measured (no GPU was lent when this was written; lavapipe gives structure only).

use crate::bindings::{declare_bindings, declare_uniform, Access};

/// One Mimi kernel (each its own WGSL module with entry point `main`): either one thread per
/// index through `PER_INDEX_MAIN` (64 threads per workgroup), or its own entry point over a
/// grid of workgroups the host chooses (`MimiKernel::grid_launched`).
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

    /// The module's WGSL source: the bindings, the uniform block (the kernel's own fields, then
    /// one slot stride per storage binding), the slot offsets (`slot_prelude`), the shared
    /// snippets and the kernel, whose every index into a storage binding is offset by the
    /// launch's slot (`offset_by_slot`).
    pub fn source(self) -> String {
        use super::wgsl_codec as c;
        use super::wgsl_conv as v;
        let body = match self {
            MimiKernel::Conv => [v::CONV_IN, v::CONV_OUT, v::CONV].concat(),
            MimiKernel::ConvSplit => {
                [v::CONV_IN, v::CONV_OUT, v::CONV_SPLIT, v::SPLIT_MAIN].concat()
            }
            MimiKernel::ConvHistory => v::CONV_HISTORY.to_string(),
            MimiKernel::ConvTranspose => [v::CONV_OUT, v::CONV_TR_FULL, v::CONV_TRANSPOSE].concat(),
            MimiKernel::ConvTrSplit => [
                v::CONV_OUT,
                v::CONV_TR_FULL,
                v::CONV_TR_SPLIT,
                v::SPLIT_MAIN,
            ]
            .concat(),
            MimiKernel::RvqDecode => c::RVQ_DECODE.to_string(),
            MimiKernel::RvqScore => c::RVQ_SCORE.to_string(),
            MimiKernel::RvqPick => c::RVQ_PICK.to_string(),
            MimiKernel::Transpose => c::TRANSPOSE.to_string(),
            MimiKernel::LayerNorm => c::LAYER_NORM.to_string(),
            MimiKernel::Linear => c::LINEAR.to_string(),
            MimiKernel::RopeStore => c::ROPE_STORE.to_string(),
            MimiKernel::Attention => c::ATTENTION.to_string(),
            MimiKernel::Advance => c::ADVANCE.to_string(),
        };
        let main = if self.grid_launched() {
            ""
        } else {
            PER_INDEX_MAIN
        };
        let storage = self.storage_names();
        let all_buffers = format!("{}, {SLOT_LIST}: u32", self.buffers());
        let bindings = declare_bindings(self.access(), "P: Params", &all_buffers);
        let own = self.params().split(',').map(|f| match f.split_once(':') {
            Some((name, ty)) => (name.trim().to_string(), ty.trim()),
            None => (f.trim().to_string(), "u32"),
        });
        let strides = storage.iter().map(|n| (format!("s_{n}"), "u32"));
        let fields: Vec<(String, &str)> = std::iter::once(("threads".to_string(), "u32"))
            .chain(own)
            .chain(strides)
            .collect();
        assert!(
            fields.len() <= UNIFORM_WORDS,
            "{self:?}: more fields than the {UNIFORM_WORDS}-word block"
        );
        let params = declare_uniform("Params", fields.iter().map(|(n, t)| (n.as_str(), *t)));
        let reduce = if self.grid_launched()
            && !matches!(
                self,
                MimiKernel::Advance | MimiKernel::ConvSplit | MimiKernel::ConvTrSplit
            ) {
            reduce_256()
        } else {
            String::new()
        };
        let body = offset_by_slot(&body, &storage);
        [
            bindings.as_str(),
            &params,
            &slot_prelude(&storage),
            ELU,
            &reduce,
            &body,
            main,
        ]
        .concat()
    }

    /// The names of the kernel's storage bindings (binding 1 on, without the slot list), in
    /// binding order: the order of the stride words after the kernel's own fields.
    pub(crate) fn storage_names(self) -> Vec<&'static str> {
        self.buffers()
            .split(',')
            .filter_map(|b| b.split_once(':').map(|(n, _)| n.trim()))
            .collect()
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
            MimiKernel::Conv | MimiKernel::ConvSplit => &[U, R, R, R, R, W, W, R, R],
            MimiKernel::ConvHistory => &[U, R, W, R, R],
            MimiKernel::ConvTranspose => &[U, R, W, R, R, W, W, R],
            MimiKernel::ConvTrSplit => &[U, R, R, R, R, W, W, W, R],
            MimiKernel::RvqDecode => &[U, R, R, R, R, W, R],
            MimiKernel::RvqScore => &[U, R, R, R, R, W, R],
            MimiKernel::RvqPick => &[U, R, R, R, W, W, R],
            MimiKernel::Transpose => &[U, R, W, R],
            MimiKernel::LayerNorm => &[U, R, R, R, W, R],
            MimiKernel::Linear => &[U, R, R, W, R, R],
            MimiKernel::RopeStore => &[U, W, W, W, R, R, R],
            MimiKernel::Attention => &[U, R, R, R, W, R, R],
            MimiKernel::Advance => &[U, W, R],
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

/// The name of every kernel's last binding: the call's slot list, `[n, slot₀, …, slotₙ₋₁]` (the
/// number of listed slots, then the slots in list order).
pub(crate) const SLOT_LIST: &str = "slot_list";

/// Words of a launch's uniform block (the thread count, the kernel's own fields, one slot stride
/// per storage binding).
pub(crate) const UNIFORM_WORDS: usize = 32;

/// The slot offsets of a kernel with storage bindings `names`: one private `o_NAME` per binding
/// and `set_slot(z)`, which every entry point calls first with the place `z` of its workgroup's
/// slot in the call's list, and which sets `o_NAME` to the slot's start in `NAME` (the slot
/// times the binding's stride `P.s_NAME`; a stride of 0 is a buffer every slot shares: the
/// weights).
fn slot_prelude(names: &[&str]) -> String {
    let mut out = String::new();
    for n in names {
        out.push_str(&format!("var<private> o_{n}: u32;\n"));
    }
    out.push_str(&format!(
        "fn set_slot(z: u32) {{\n    let s = {SLOT_LIST}[1u + z];\n"
    ));
    for n in names {
        out.push_str(&format!("    o_{n} = s * P.s_{n};\n"));
    }
    out.push_str("}\n");
    out.push_str(SLOT_X);
    out
}

/// The entry of a grid-launched kernel: its grid's x is the kernel's x times the number of listed
/// slots, the slots innermost (workgroups `x·n .. x·n + n` are workgroup `x` of each listed
/// slot, launched next to each other, so they read the same weights while those are in the
/// cache). Sets the slot offsets and returns the kernel's own x. A call with no listed slot
/// launches nothing, so `n` is at least 1 here.
const SLOT_X: &str = r#"
fn slot_x(x: u32) -> u32 {
    let n = slot_list[0];
    set_slot(x % n);
    return x / n;
}
"#;

/// `body` with every index into a storage binding of `names` offset by the launch's slot:
/// `NAME[` becomes `NAME[o_NAME + ` (only where `NAME` is a whole identifier, not a field). The
/// kernels are written for one slot and the slot dimension is applied here, to every access at
/// once, so that no access can miss it. The uniform block and the workgroup arrays are not
/// bindings and are left as they are.
pub(crate) fn offset_by_slot(body: &str, names: &[&str]) -> String {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.';
    let mut out = String::with_capacity(body.len() + 256);
    let mut rest = body;
    'scan: while let Some(c) = rest.chars().next() {
        if out.chars().next_back().is_none_or(|p| !is_ident(p)) {
            for n in names {
                if let Some(after) = rest.strip_prefix(n).and_then(|r| r.strip_prefix('[')) {
                    out.push_str(&format!("{n}[o_{n} + "));
                    rest = after;
                    continue 'scan;
                }
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
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
    set_slot(wid.z);
    let i = (wid.y * nwg.x + wid.x) * 64u + lid;
    if (i < P.threads) {
        body(i);
    }
}
"#;

/// The 256-thread tree reductions of the grid-launched kernels (a fixed pairing order, so every
/// workgroup that reduces the same values gets the same bits): `reduce_256` is
/// [`crate::shaders::tree_reduce`] over `red`. Each call begins and ends with a barrier, so the
/// shared array is free again when it returns.
fn reduce_256() -> String {
    [
        "\nvar<workgroup> red: array<f32, 256>;\n",
        &crate::shaders::tree_reduce("reduce_256", "red", 256, true),
        REDUCE_TEAM_32,
    ]
    .concat()
}

/// The per-team sums that share [`reduce_256`]'s array.
const REDUCE_TEAM_32: &str = r#"
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
