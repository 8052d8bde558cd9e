//! MLX quantized safetensors: grouping `X.weight` (packed u32) + `X.scales` + `X.biases` triplets
//! into one source tensor with its (bits, group size).

use std::collections::HashMap;

use super::{CheckpointError, DType, Quant, RawTensor};

/// A source tensor after MLX triplet grouping.
pub(super) struct SourceTensor {
    /// Base name (`X.weight` for triplets).
    pub(super) name: String,
    pub(super) data: RawTensor,
    pub(super) quant: Quant,
    pub(super) scales: Option<RawTensor>,
    pub(super) biases: Option<RawTensor>,
    /// Logical (dequantized) shape.
    pub(super) shape: Vec<usize>,
}

/// Group MLX `X.weight`(u32) + `X.scales` + `X.biases` triplets and infer (bits, group).
pub(super) fn group_mlx(
    raw: &[RawTensor],
    mlx_bits_group: Option<(u8, usize)>,
) -> Result<Vec<SourceTensor>, CheckpointError> {
    let by_name: HashMap<&str, &RawTensor> = raw.iter().map(|t| (t.name.as_str(), t)).collect();
    let mut out = Vec::with_capacity(raw.len());
    struct Trip<'a> {
        base: String,
        w: &'a RawTensor,
        s: &'a RawTensor,
        b: &'a RawTensor,
    }
    let mut trips = Vec::new();
    let mut consumed = std::collections::HashSet::new();
    for t in raw {
        if let Some(base) = t.name.strip_suffix(".scales") {
            let bad = |reason: &str| CheckpointError::BadQuantization {
                name: base.to_string(),
                reason: reason.into(),
            };
            let w = by_name
                .get(format!("{base}.weight").as_str())
                .copied()
                .ok_or_else(|| bad("`.scales` without `.weight`"))?;
            let b = by_name
                .get(format!("{base}.biases").as_str())
                .copied()
                .ok_or_else(|| bad("`.scales` without `.biases`"))?;
            if w.dtype != DType::U32 {
                return Err(bad(&format!(
                    "packed weight has dtype {}, expected u32",
                    w.dtype
                )));
            }
            if w.shape.len() != 2
                || t.shape.len() != 2
                || b.shape != t.shape
                || w.shape[0] != t.shape[0]
                || b.dtype != t.dtype
            {
                return Err(bad(&format!(
                    "inconsistent shapes: weight {:?}, scales {:?}, biases {:?}",
                    w.shape, t.shape, b.shape
                )));
            }
            if !t.dtype.is_float() {
                return Err(bad(&format!("scales have dtype {}", t.dtype)));
            }
            consumed.insert(w.name.as_str());
            consumed.insert(t.name.as_str());
            consumed.insert(b.name.as_str());
            trips.push(Trip {
                base: base.to_string(),
                w,
                s: t,
                b,
            });
        } else if let Some(base) = t.name.strip_suffix(".biases") {
            if !by_name.contains_key(format!("{base}.scales").as_str()) {
                return Err(CheckpointError::BadQuantization {
                    name: base.to_string(),
                    reason: "`.biases` without `.scales`".into(),
                });
            }
        }
    }
    // Infer (bits, group): candidates per triplet; resolve ambiguity file-wide with the norm widths.
    let candidates = |w: &RawTensor, s: &RawTensor| -> Vec<(u8, usize)> {
        let mut c = Vec::new();
        for bits in [4u8, 8] {
            for group in [32usize, 64] {
                let cols = w.shape[1] * 32 / bits as usize;
                if s.shape[1] * group == cols {
                    c.push((bits, group));
                }
            }
        }
        c
    };
    let file_choice = if let Some(bg) = mlx_bits_group {
        Some(bg)
    } else {
        // Known widths: 1-D norm weights of the file (`*norm*.weight` / `alpha`).
        let widths: Vec<usize> = raw
            .iter()
            .filter(|t| t.name.contains("norm") && t.shape.len() == 1)
            .map(|t| t.shape[0])
            .collect();
        let mut choice = None;
        for tr in &trips {
            let c = candidates(tr.w, tr.s);
            if c.len() == 1 {
                choice = Some(c[0]);
                break;
            }
            let fits: Vec<_> = c
                .iter()
                .filter(|(bits, _)| widths.contains(&(tr.w.shape[1] * 32 / *bits as usize)))
                .collect();
            if fits.len() == 1 {
                choice = Some(*fits[0]);
                break;
            }
        }
        choice
    };
    for tr in trips {
        let c = candidates(tr.w, tr.s);
        let chosen = match (c.len(), file_choice) {
            (0, _) => None,
            (_, Some(fc)) if c.contains(&fc) => Some(fc),
            (1, _) => Some(c[0]),
            _ => None,
        };
        let (bits, group) = chosen.ok_or_else(|| CheckpointError::BadQuantization {
            name: tr.base.clone(),
            reason: format!(
                "cannot infer bits/group from weight {:?} and scales {:?} (candidates {c:?})",
                tr.w.shape, tr.s.shape
            ),
        })?;
        let cols = tr.w.shape[1] * 32 / bits as usize;
        out.push(SourceTensor {
            name: format!("{}.weight", tr.base),
            data: tr.w.clone(),
            quant: Quant::Mlx {
                bits,
                group,
                scale_dtype: tr.s.dtype,
            },
            scales: Some(tr.s.clone()),
            biases: Some(tr.b.clone()),
            shape: vec![tr.w.shape[0], cols],
        });
    }
    for t in raw {
        if consumed.contains(t.name.as_str()) {
            continue;
        }
        out.push(SourceTensor {
            name: t.name.clone(),
            data: t.clone(),
            quant: Quant::Plain(t.dtype),
            scales: None,
            biases: None,
            shape: t.shape.clone(),
        });
    }
    Ok(out)
}
