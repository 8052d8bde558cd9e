//! Checkpoint loading: safetensors (mmap), GGUF (hand-written reader), MLX quantized triplets, name
//! mapping of every released layout onto the canonical Kyutai PyTorch names, bundles and typed refusals.
//!
//! Canonical names are those of `kyutai/moshiko-pytorch-bf16` `model.safetensors` (legacy
//! `in_proj_weight` layout) for the LM and of `tokenizer-e351c8d8-checkpoint125.safetensors` for Mimi.
//!
//! Modules by concern: configs ([`LmConfig`], [`MimiConfig`], [`LmGenConfig`], [`BundleConfig`]; JSON
//! helpers in `json.rs`), the bundle directory ([`Bundle`]), file bytes and page release (`mapped.rs`),
//! format detection (`format.rs`), containers ([`safetensors`], [`gguf`]), MLX triplets (`mlx.rs`),
//! dequantization (`dequant.rs`), name mapping ([`names`]), the tensor access API ([`Weights`]) and the
//! expected inventory with its checks ([`Schema`]).

mod bundle;
mod bundle_config;
mod dequant;
mod error;
mod format;
mod gen_config;
pub mod gguf;
mod json;
mod layers;
mod lm_config;
mod mapped;
mod mimi_config;
mod mlx;
pub mod names;
pub mod safetensors;
mod schema;
mod weights;

use std::fmt;

pub use bundle::{Bundle, BundleFiles};
pub use bundle_config::{BundleConfig, SttConfig, MIMI_NAME, MOSHI_NAME, TOKENIZER_NAME};
pub use error::{CheckpointError, Malformed};
pub use gen_config::LmGenConfig;
pub use layers::{ffn_hidden, Gating, NormKind, PosEmb};
pub use lm_config::LmConfig;
pub use mimi_config::{MimiConfig, MimiTransformerConfig, QuantizerConfig, SeanetConfig};
pub use schema::{Allowed, Schema, TensorSpec};
pub use weights::{OpenOptions, TensorInfo, Weights};

/// Which model a weights file belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Component {
    /// The Moshi language model.
    Lm,
    /// The Mimi audio codec.
    Mimi,
}

impl fmt::Display for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Component::Lm => "lm",
            Component::Mimi => "mimi",
        })
    }
}

/// How a tensor's values are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quant {
    /// Plain or GGML block type.
    Plain(DType),
    /// MLX affine quantization: u32-packed codes with per-group scales and biases (`scale_dtype`).
    Mlx {
        /// Bits per code (4 or 8).
        bits: u8,
        /// Group size (32 or 64).
        group: usize,
        /// Dtype of scales and biases.
        scale_dtype: DType,
    },
}

impl Quant {
    /// Short description (`bf16`, `q8_0`, `mlx-q4-g32`...).
    pub fn name(&self) -> String {
        match self {
            Quant::Plain(d) => d.name().to_string(),
            Quant::Mlx { bits, group, .. } => format!("mlx-q{bits}-g{group}"),
        }
    }
}

/// Element type of a stored tensor (container-level; MLX triplets are U32 + scales + biases).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// 64-bit float.
    F64,
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// 64-bit signed integer.
    I64,
    /// 32-bit signed integer.
    I32,
    /// 16-bit signed integer.
    I16,
    /// 8-bit signed integer.
    I8,
    /// 64-bit unsigned integer.
    U64,
    /// 32-bit unsigned integer (MLX packed codes).
    U32,
    /// 16-bit unsigned integer.
    U16,
    /// 8-bit unsigned integer.
    U8,
    /// Boolean (one byte).
    Bool,
    /// GGML Q8_0 blocks (32 values, 34 bytes).
    Q8_0,
    /// GGML Q4_0 blocks (32 values, 18 bytes).
    Q4_0,
}

impl DType {
    /// Parse a safetensors dtype string.
    pub fn from_safetensors(s: &str) -> Option<DType> {
        Some(match s {
            "F64" => DType::F64,
            "F32" => DType::F32,
            "F16" => DType::F16,
            "BF16" => DType::Bf16,
            "I64" => DType::I64,
            "I32" => DType::I32,
            "I16" => DType::I16,
            "I8" => DType::I8,
            "U64" => DType::U64,
            "U32" => DType::U32,
            "U16" => DType::U16,
            "U8" => DType::U8,
            "BOOL" => DType::Bool,
            _ => return None,
        })
    }
    /// (values per block, bytes per block): 1 value per element for plain types.
    pub fn block(self) -> (u64, u64) {
        match self {
            DType::F64 | DType::I64 | DType::U64 => (1, 8),
            DType::F32 | DType::I32 | DType::U32 => (1, 4),
            DType::F16 | DType::Bf16 | DType::I16 | DType::U16 => (1, 2),
            DType::I8 | DType::U8 | DType::Bool => (1, 1),
            DType::Q8_0 => (32, 34),
            DType::Q4_0 => (32, 18),
        }
    }
    /// Bytes for `n` values along a row (n must be a multiple of the block size); `None` on overflow.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let (vals, bytes) = self.block();
        if !n.is_multiple_of(vals) {
            return None;
        }
        (n / vals).checked_mul(bytes)
    }
    /// True for f32/f16/bf16 (and f64).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F64 | DType::F32 | DType::F16 | DType::Bf16)
    }
    /// Short name (as `inspect` prints it).
    pub fn name(self) -> &'static str {
        match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I16 => "i16",
            DType::I8 => "i8",
            DType::U64 => "u64",
            DType::U32 => "u32",
            DType::U16 => "u16",
            DType::U8 => "u8",
            DType::Bool => "bool",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One tensor as the container declares it, validated against the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawTensor {
    /// Name in the file.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Row-major shape (GGUF dims already reversed to outermost-first).
    pub shape: Vec<usize>,
    /// Absolute byte offset in the file.
    pub offset: usize,
    /// Byte length.
    pub len: usize,
}

impl RawTensor {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Container format of a weights file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    /// safetensors.
    Safetensors,
    /// GGUF (v2/v3).
    Gguf,
}

impl fmt::Display for FileFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FileFormat::Safetensors => "safetensors",
            FileFormat::Gguf => "gguf",
        })
    }
}

/// Check that the 0-based byte range `[offset, offset+len)` of a tensor set is disjoint.
pub(crate) fn check_overlaps(tensors: &[RawTensor]) -> Result<(), Malformed> {
    let mut idx: Vec<usize> = (0..tensors.len()).filter(|&i| tensors[i].len > 0).collect();
    idx.sort_by_key(|&i| tensors[i].offset);
    for w in idx.windows(2) {
        let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
        if a.offset + a.len > b.offset {
            return Err(Malformed::Overlapping {
                a: a.name.clone(),
                b: b.name.clone(),
            });
        }
    }
    Ok(())
}

/// Validate a shape: element count and byte length must not overflow; returns (numel, bytes).
pub(crate) fn checked_size(
    name: &str,
    dtype: DType,
    dims: &[u64],
) -> Result<(u64, u64), Malformed> {
    let overflow = || Malformed::DimsOverflow {
        tensor: name.to_string(),
        dims: dims.to_vec(),
    };
    let mut numel: u64 = 1;
    for &d in dims {
        numel = numel.checked_mul(d).ok_or_else(overflow)?;
    }
    // Never above 2^48 elements: no real checkpoint comes close, and it keeps usize math safe.
    if numel > (1u64 << 48) || dims.iter().any(|&d| d > usize::MAX as u64) {
        return Err(overflow());
    }
    let (vals, _) = dtype.block();
    if vals > 1 {
        let inner = dims.last().copied().unwrap_or(1);
        if inner % vals != 0 {
            return Err(Malformed::BlockMisfit {
                tensor: name.to_string(),
                inner,
                block: vals,
            });
        }
    }
    let bytes = dtype.bytes_for(numel).ok_or_else(overflow)?;
    Ok((numel, bytes))
}

#[cfg(test)]
mod tests;

/// The variant name of a result's error as the derived `Debug` prints it (`"Ok"` for a success),
/// so that a refusal test can list its cases as (input, expected variant) rows checked by one loop.
#[cfg(test)]
pub(crate) fn err_variant<T, E: std::fmt::Debug>(r: &Result<T, E>) -> String {
    match r {
        Ok(_) => "Ok".into(),
        Err(e) => format!("{e:?}")
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .next()
            .unwrap_or_default()
            .to_string(),
    }
}
