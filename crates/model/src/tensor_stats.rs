//! Value statistics of checkpoint tensors and a plausibility check per tensor kind: a gate that
//! catches a corrupted or mis-dequantized file (NaN, infinities, a zeroed matrix, scales off by
//! orders of magnitude) before it produces garbage audio.
//!
//! The bounds are deliberately wide: they separate "trained or random weights of realistic scale"
//! from "broken", not one checkpoint from another.

use crate::checkpoint::CheckpointError;
use crate::checkpoint::Weights;

/// Summary of the values of one tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TensorStats {
    /// Number of values.
    pub count: usize,
    /// Values that are NaN.
    pub nan: usize,
    /// Values that are +/- infinity.
    pub inf: usize,
    /// Root mean square of the finite values.
    pub rms: f64,
    /// Largest absolute finite value.
    pub max_abs: f32,
}

impl TensorStats {
    /// Statistics of `values`.
    pub fn of(values: &[f32]) -> TensorStats {
        let mut nan = 0;
        let mut inf = 0;
        let mut sum_sq = 0f64;
        let mut max_abs = 0f32;
        for &v in values {
            if v.is_nan() {
                nan += 1;
            } else if v.is_infinite() {
                inf += 1;
            } else {
                sum_sq += f64::from(v) * f64::from(v);
                max_abs = max_abs.max(v.abs());
            }
        }
        let finite = values.len() - nan - inf;
        TensorStats {
            count: values.len(),
            nan,
            inf,
            rms: if finite > 0 {
                (sum_sq / finite as f64).sqrt()
            } else {
                0.0
            },
            max_abs,
        }
    }
}

/// What a tensor is, as far as its plausible value range goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorKind {
    /// Weights of linear layers, convolutions and embeddings.
    Weight,
    /// Biases.
    Bias,
    /// Normalisation gains (`alpha`, norm `weight`) and layer scales.
    Gain,
    /// Codebook bookkeeping of Mimi's quantizer (sums and usage counts, flags): any finite value.
    Codebook,
}

impl TensorKind {
    /// The kind of a canonical tensor name.
    pub fn of(name: &str) -> TensorKind {
        if name.contains("_codebook.") {
            TensorKind::Codebook
        } else if name.ends_with(".bias") {
            TensorKind::Bias
        } else if name.ends_with(".alpha") || name.contains("norm") || name.contains("layer_scale")
        {
            TensorKind::Gain
        } else {
            TensorKind::Weight
        }
    }

    /// Lower-case name for reports.
    pub fn name(self) -> &'static str {
        match self {
            TensorKind::Weight => "weight",
            TensorKind::Bias => "bias",
            TensorKind::Gain => "gain",
            TensorKind::Codebook => "codebook",
        }
    }

    /// Why `stats` is implausible for this kind, or `None` when it is plausible.
    pub fn implausible(self, stats: &TensorStats) -> Option<String> {
        if stats.nan > 0 || stats.inf > 0 {
            return Some(format!(
                "{} NaN and {} infinite values out of {}",
                stats.nan, stats.inf, stats.count
            ));
        }
        let (min_rms, max_abs) = match self {
            // A trained or initialised matrix is never all zeros, and a weight of magnitude 1e4
            // means a scale was applied twice or read with the wrong type.
            TensorKind::Weight => (1e-6, 1e4),
            TensorKind::Bias => (0.0, 1e4),
            TensorKind::Gain => (0.0, 1e4),
            TensorKind::Codebook => (0.0, f32::INFINITY),
        };
        if stats.count > 0 && stats.rms < min_rms {
            return Some(format!(
                "all (or nearly all) zeros: rms {:.2e} below {min_rms:.0e}",
                stats.rms
            ));
        }
        if stats.max_abs > max_abs {
            return Some(format!(
                "magnitude {:.3e} above {max_abs:.0e} for a {}",
                stats.max_abs,
                self.name()
            ));
        }
        None
    }
}

/// One tensor that failed [`TensorKind::implausible`].
#[derive(Debug, Clone, PartialEq)]
pub struct TensorProblem {
    /// Canonical tensor name.
    pub name: String,
    /// Its kind.
    pub kind: TensorKind,
    /// Why it failed.
    pub reason: String,
}

/// Totals of an audit over every tensor of a weights file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AuditReport {
    /// Tensors read.
    pub tensors: usize,
    /// Values read.
    pub values: usize,
    /// Tensors with implausible values.
    pub problems: Vec<TensorProblem>,
}

/// Dequantizes every tensor of `weights` (one at a time, releasing its pages afterwards) and
/// checks its values against its kind.
pub fn audit(weights: &Weights) -> Result<AuditReport, CheckpointError> {
    let mut report = AuditReport::default();
    let names: Vec<String> = weights.names().map(str::to_string).collect();
    for name in names {
        let (values, _) = weights.f32(&name)?;
        let stats = TensorStats::of(&values);
        report.tensors += 1;
        report.values += stats.count;
        let kind = TensorKind::of(&name);
        if let Some(reason) = kind.implausible(&stats) {
            report.problems.push(TensorProblem { name, kind, reason });
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_count_non_finite_values_apart() {
        let s = TensorStats::of(&[3.0, -4.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
        assert_eq!((s.count, s.nan, s.inf), (5, 1, 2));
        assert!((s.rms - (12.5f64).sqrt()).abs() < 1e-12);
        assert_eq!(s.max_abs, 4.0);
        assert_eq!(TensorStats::of(&[]).rms, 0.0);
    }

    #[test]
    fn kinds_from_names() {
        for (n, k) in [
            (
                "transformer.layers.0.self_attn.in_proj_weight",
                TensorKind::Weight,
            ),
            ("text_emb.weight", TensorKind::Weight),
            ("out_norm.alpha", TensorKind::Gain),
            (
                "encoder_transformer.transformer.layers.0.norm1.weight",
                TensorKind::Gain,
            ),
            (
                "decoder_transformer.transformer.layers.1.layer_scale_2.scale",
                TensorKind::Gain,
            ),
            ("encoder.model.0.conv.conv.bias", TensorKind::Bias),
            (
                "quantizer.rvq_first.vq.layers.0._codebook.cluster_usage",
                TensorKind::Codebook,
            ),
        ] {
            assert_eq!(TensorKind::of(n), k, "{n}");
        }
    }

    #[test]
    fn plausibility_per_kind() {
        let ok = TensorStats::of(&[0.01, -0.02, 0.03]);
        for k in [
            TensorKind::Weight,
            TensorKind::Bias,
            TensorKind::Gain,
            TensorKind::Codebook,
        ] {
            assert_eq!(k.implausible(&ok), None, "{k:?}");
            assert!(k.implausible(&TensorStats::of(&[0.1, f32::NAN])).is_some());
        }
        let zeros = TensorStats::of(&[0.0; 16]);
        assert!(TensorKind::Weight
            .implausible(&zeros)
            .unwrap()
            .contains("zeros"));
        assert_eq!(TensorKind::Bias.implausible(&zeros), None);
        let huge = TensorStats::of(&[1e6, 0.1]);
        assert!(TensorKind::Weight.implausible(&huge).is_some());
        assert!(TensorKind::Gain.implausible(&huge).is_some());
        assert_eq!(TensorKind::Codebook.implausible(&huge), None);
    }
}
