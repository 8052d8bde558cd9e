//! The uniform blocks of the kernels, each declared once for the host, which writes it, and for
//! the shaders, whose sources [`crate::shaders`] assembles with its WGSL declaration. They live
//! apart from the code that fills them so that the shader sources depend on this file alone.

use crate::bindings::uniform_block;

uniform_block! {
    /// The uniform block `M` of the non-weight kernels (RMS norm, attention with RoPE and KV store;
    /// [`crate::shaders::Module::source`] declares it to them); each reads the fields
    /// it needs. `ctx` is the ring capacity per session, `fixed_slot` the ring slot of a Depformer
    /// step (−1 for the temporal stack), `kv16` whether the ring holds bf16 pairs (else f32),
    /// `chunk` the keys per attention workgroup (≤ 64), `nchunks` the chunks of a full ring
    /// (the partials' stride), `direct` whether one chunk covers the ring (no merge pass).
    pub(crate) struct Misc {
        pub(crate) d: u32,
        pub(crate) w_off: u32,
        pub(crate) eps: f32,
        pub(crate) heads: u32,
        pub(crate) head_dim: u32,
        pub(crate) ctx: u32,
        pub(crate) fixed_slot: i32,
        pub(crate) rope: bool,
        pub(crate) kv16: bool,
        pub(crate) chunk: u32,
        pub(crate) nchunks: u32,
        pub(crate) direct: bool,
    }
}

uniform_block! {
    /// The uniform block `P` of a weight-reading dispatch: the chunk's shape (set per chunk by
    /// [`crate::matrix::GpuMatrix::dispatches`], whatever the caller gave), then the caller's
    /// strides and offsets. The matmul reads activations as `vec4<f32>`: `ld_x`
    /// and `x_off` must be multiples of 4.
    pub(crate) struct MatParams {
        pub(crate) rows: u32,
        pub(crate) cols: u32,
        pub(crate) group: u32,
        pub(crate) row0: u32,
        pub(crate) ld_x: u32,
        pub(crate) x_off: u32,
        pub(crate) ld_y: u32,
        pub(crate) y_off: u32,
        pub(crate) accumulate: bool,
        /// Words (u32) of the codes plane per row: rows are padded to 16 bytes (see
        /// [`crate::matrix::GpuMatrix::upload`]).
        pub(crate) ld_w: u32,
        /// Offset (floats, a multiple of 4) of a fused RMS norm's weights in the `nw` binding.
        pub(crate) norm_off: u32,
        /// The fused RMS norm's epsilon.
        pub(crate) eps: f32,
    }
}

uniform_block! {
    /// The uniform block `C` of the copy kernel: the 16-byte words to copy.
    pub(crate) struct CopyParams {
        pub(crate) n: u32,
    }
}

uniform_block! {
    /// The uniform block `S` of the sampling kernel: the stream (0 text, 1 audio), its vocabulary,
    /// the stride of the logits' rows, the words per sampling record, and where in the step buffer
    /// the sampled tokens go for the next Depformer step.
    pub(crate) struct SampleParams {
        pub(crate) stream: u32,
        pub(crate) vocab: u32,
        pub(crate) ld: u32,
        pub(crate) stride: u32,
        pub(crate) prev: u32,
    }
}
