//! Layer choices shared by the LM and Mimi transformer configs (`norm`, `gating`,
//! `positional_embedding` keys) and the FFN width rule of `modules/gating.py`.

use super::json::bad;
use super::CheckpointError;

/// Normalisation layer kind (`norm` key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormKind {
    /// `layer_norm`: LayerNorm with bias, eps 1e-5.
    LayerNorm,
    /// `layer_norm_f32`: LayerNorm computed in f32, eps 1e-8.
    LayerNormF32,
    /// `rms_norm`: RMSNorm, eps 1e-5.
    RmsNorm,
    /// `rms_norm_f32`: RMSNorm computed in f32, eps 1e-8 (Moshi LM).
    RmsNormF32,
}

impl NormKind {
    /// Parse the Python name.
    pub fn parse(key: &str, s: &str) -> Result<Self, CheckpointError> {
        Ok(match s {
            "layer_norm" => NormKind::LayerNorm,
            "layer_norm_f32" => NormKind::LayerNormF32,
            "rms_norm" => NormKind::RmsNorm,
            "rms_norm_f32" => NormKind::RmsNormF32,
            _ => return Err(bad(key, format!("unknown norm `{s}`"))),
        })
    }
    /// Epsilon as in Python `create_norm_fn`.
    pub fn eps(self) -> f32 {
        match self {
            NormKind::LayerNorm | NormKind::RmsNorm => 1e-5,
            NormKind::LayerNormF32 | NormKind::RmsNormF32 => 1e-8,
        }
    }
    /// The Python name.
    pub fn name(self) -> &'static str {
        match self {
            NormKind::LayerNorm => "layer_norm",
            NormKind::LayerNormF32 => "layer_norm_f32",
            NormKind::RmsNorm => "rms_norm",
            NormKind::RmsNormF32 => "rms_norm_f32",
        }
    }
    /// True for RMSNorm variants (weight `alpha` `[1, 1, d]`, no bias).
    pub fn is_rms(self) -> bool {
        matches!(self, NormKind::RmsNorm | NormKind::RmsNormF32)
    }
}

/// Feed-forward kind (`gating` key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    /// `none`: plain FFN `linear2(gelu(linear1(x)))`.
    None,
    /// `silu`: gated `linear_out(silu(a) * b)` with `[a; b] = linear_in(x)`.
    Silu,
    /// `gelu`: gated with GELU.
    Gelu,
    /// `relu`: gated with ReLU.
    Relu,
    /// `sigmoid`: gated with sigmoid.
    Sigmoid,
}

impl Gating {
    /// Parse the Python name.
    pub fn parse(key: &str, s: &str) -> Result<Self, CheckpointError> {
        Ok(match s {
            "none" => Gating::None,
            "silu" => Gating::Silu,
            "gelu" => Gating::Gelu,
            "relu" => Gating::Relu,
            "sigmoid" => Gating::Sigmoid,
            _ => return Err(bad(key, format!("unknown gating `{s}`"))),
        })
    }
    /// The Python name.
    pub fn name(self) -> &'static str {
        match self {
            Gating::None => "none",
            Gating::Silu => "silu",
            Gating::Gelu => "gelu",
            Gating::Relu => "relu",
            Gating::Sigmoid => "sigmoid",
        }
    }
}

/// Hidden size of the FFN as `modules/gating.py` / `transformer.py` compute it.
///
/// For a gated FFN: `21*dim/8` when `dim_feedforward == 4*dim`, else `2*dim_feedforward/3`
/// (integer division); for `gating = none` the hidden size is `dim_feedforward` itself.
pub fn ffn_hidden(gating: Gating, dim: usize, dim_feedforward: usize) -> usize {
    match gating {
        Gating::None => dim_feedforward,
        _ => {
            if dim_feedforward == 4 * dim {
                (21 * dim) / 8
            } else {
                (2 * dim_feedforward) / 3
            }
        }
    }
}

/// Positional embedding kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PosEmb {
    /// `none`.
    None,
    /// `rope` (interleaved pairs).
    Rope,
    /// `sin`.
    Sin,
    /// `sin_rope`.
    SinRope,
    /// `rope_concat` (half-split RoPE).
    RopeConcat,
}

impl PosEmb {
    /// Parse the Python name.
    pub fn parse(key: &str, s: &str) -> Result<Self, CheckpointError> {
        Ok(match s {
            "none" => PosEmb::None,
            "rope" => PosEmb::Rope,
            "sin" => PosEmb::Sin,
            "sin_rope" => PosEmb::SinRope,
            "rope_concat" => PosEmb::RopeConcat,
            _ => return Err(bad(key, format!("unknown positional embedding `{s}`"))),
        })
    }
    /// The Python name.
    pub fn name(self) -> &'static str {
        match self {
            PosEmb::None => "none",
            PosEmb::Rope => "rope",
            PosEmb::Sin => "sin",
            PosEmb::SinRope => "sin_rope",
            PosEmb::RopeConcat => "rope_concat",
        }
    }
}
