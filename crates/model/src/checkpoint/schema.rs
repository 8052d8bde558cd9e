//! Schema inventory: the full canonical name → shape → allowed-storage table of the Moshi LM and of
//! Mimi, generated from [`LmConfig`] / [`MimiConfig`] so tiny configs get their own schema.

use std::collections::HashMap;

use super::lm_config::LmConfig;
use super::mimi_config::MimiConfig;
use super::weights::Weights;
use super::{CheckpointError, Component, DType, Quant};

/// Storage a tensor may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allowed {
    /// f32 / f16 / bf16 only (norms, convs, codebooks).
    Float,
    /// A weight matrix: float, GGML Q8_0/Q4_0 or MLX affine (linears, embeddings).
    Matrix,
    /// Float or an integer/bool flag (`_codebook._initialized`).
    FloatOrFlag,
}

impl Allowed {
    /// Human-readable list.
    pub fn describe(self) -> &'static str {
        match self {
            Allowed::Float => "f32, f16, bf16",
            Allowed::Matrix => "f32, f16, bf16, q8_0, q4_0, mlx-q4/q8",
            Allowed::FloatOrFlag => "f32, f16, bf16, bool, u8, i64, f64",
        }
    }
}

/// One expected tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// Canonical name.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Allowed storage.
    pub allowed: Allowed,
}

/// The expected tensors of one component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    /// Which component.
    pub component: Component,
    /// Tensors in a stable order.
    pub tensors: Vec<TensorSpec>,
}

impl Schema {
    fn push(&mut self, name: String, shape: &[usize], allowed: Allowed) {
        self.tensors.push(TensorSpec {
            name,
            shape: shape.to_vec(),
            allowed,
        });
    }

    /// Look a tensor up by canonical name.
    pub fn get(&self, name: &str) -> Option<&TensorSpec> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Total number of values.
    pub fn numel(&self) -> usize {
        self.tensors
            .iter()
            .map(|t| t.shape.iter().product::<usize>())
            .sum()
    }

    /// The Moshi LM schema (canonical names of `kyutai/moshiko-pytorch-bf16`, legacy attention layout).
    pub fn lm(c: &LmConfig) -> Schema {
        use Allowed::*;
        let mut s = Schema {
            component: Component::Lm,
            tensors: Vec::new(),
        };
        let d = c.dim;
        let dd = c.depformer_dim;
        let h = c.ffn_hidden();
        let dh = c.depformer_ffn_hidden();
        let steps = c.depformer_weight_steps();
        s.push("text_emb.weight".into(), &[c.text_in_vocab(), d], Matrix);
        for i in 0..c.n_q {
            s.push(format!("emb.{i}.weight"), &[c.audio_in_vocab(), d], Matrix);
        }
        for l in 0..c.num_layers {
            let p = format!("transformer.layers.{l}.");
            s.push(format!("{p}self_attn.in_proj_weight"), &[3 * d, d], Matrix);
            s.push(format!("{p}self_attn.out_proj.weight"), &[d, d], Matrix);
            s.push(format!("{p}norm1.alpha"), &[1, 1, d], Float);
            s.push(format!("{p}norm2.alpha"), &[1, 1, d], Float);
            s.push(format!("{p}gating.linear_in.weight"), &[2 * h, d], Matrix);
            s.push(format!("{p}gating.linear_out.weight"), &[d, h], Matrix);
        }
        s.push("out_norm.alpha".into(), &[1, 1, d], Float);
        s.push("text_linear.weight".into(), &[c.text_card_out, d], Matrix);
        for k in 0..c.extra_heads_num_heads {
            s.push(
                format!("extra_heads.{k}.weight"),
                &[c.extra_heads_dim, d],
                Matrix,
            );
        }
        if c.dep_q == 0 {
            // No Depformer (speech-to-text): Python creates none of its tensors.
            return s;
        }
        for k in 0..c.depformer_in_count() {
            s.push(format!("depformer_in.{k}.weight"), &[dd, d], Matrix);
        }
        s.push(
            "depformer_text_emb.weight".into(),
            &[c.text_in_vocab(), dd],
            Matrix,
        );
        for k in 0..c.dep_q.saturating_sub(1) {
            s.push(
                format!("depformer_emb.{k}.weight"),
                &[c.audio_in_vocab(), dd],
                Matrix,
            );
        }
        for l in 0..c.depformer_num_layers {
            let p = format!("depformer.layers.{l}.");
            s.push(
                format!("{p}self_attn.in_proj_weight"),
                &[steps * 3 * dd, dd],
                Matrix,
            );
            s.push(
                format!("{p}self_attn.out_proj.weight"),
                &[steps * dd, dd],
                Matrix,
            );
            s.push(format!("{p}norm1.alpha"), &[1, 1, dd], Float);
            s.push(format!("{p}norm2.alpha"), &[1, 1, dd], Float);
            for k in 0..steps {
                s.push(
                    format!("{p}gating.{k}.linear_in.weight"),
                    &[2 * dh, dd],
                    Matrix,
                );
                s.push(
                    format!("{p}gating.{k}.linear_out.weight"),
                    &[dd, dh],
                    Matrix,
                );
            }
        }
        for k in 0..c.dep_q {
            s.push(format!("linears.{k}.weight"), &[c.card, dd], Matrix);
        }
        s
    }

    /// The Mimi schema (canonical names of `tokenizer-e351c8d8-checkpoint125.safetensors`).
    pub fn mimi(c: &MimiConfig) -> Schema {
        use Allowed::*;
        let mut s = Schema {
            component: Component::Mimi,
            tensors: Vec::new(),
        };
        let se = &c.seanet;
        let nf = se.n_filters;
        let conv = |s: &mut Schema, p: String, out: usize, inp: usize, k: usize| {
            s.push(format!("{p}.weight"), &[out, inp, k], Float);
            s.push(format!("{p}.bias"), &[out], Float);
        };
        let resblock = |s: &mut Schema, p: &str, i: usize, dim: usize| {
            let hidden = dim / se.compress;
            conv(
                s,
                format!("{p}.model.{i}.block.1.conv.conv"),
                hidden,
                dim,
                se.residual_kernel_size,
            );
            conv(
                s,
                format!("{p}.model.{i}.block.3.conv.conv"),
                dim,
                hidden,
                1,
            );
        };
        // Encoder: conv, then per ratio (reversed): resblocks, ELU, strided conv; then ELU, conv.
        let mut idx = 0;
        let mut mult = 1;
        conv(
            &mut s,
            "encoder.model.0.conv.conv".into(),
            mult * nf,
            se.channels,
            se.kernel_size,
        );
        idx += 1;
        for &r in se.ratios.iter().rev() {
            for _ in 0..se.n_residual_layers {
                resblock(&mut s, "encoder", idx, mult * nf);
                idx += 1;
            }
            idx += 1; // ELU
            conv(
                &mut s,
                format!("encoder.model.{idx}.conv.conv"),
                mult * nf * 2,
                mult * nf,
                2 * r,
            );
            idx += 1;
            mult *= 2;
        }
        idx += 1; // ELU
        conv(
            &mut s,
            format!("encoder.model.{idx}.conv.conv"),
            se.dimension,
            mult * nf,
            se.last_kernel_size,
        );
        // Decoder: conv, then per ratio: ELU, transposed conv, resblocks; then ELU, conv.
        let mut mult = 1 << se.ratios.len();
        conv(
            &mut s,
            "decoder.model.0.conv.conv".into(),
            mult * nf,
            se.dimension,
            se.kernel_size,
        );
        let mut idx = 1;
        for &r in &se.ratios {
            idx += 1; // ELU
            let p = format!("decoder.model.{idx}.convtr.convtr");
            s.push(
                format!("{p}.weight"),
                &[mult * nf, mult * nf / 2, 2 * r],
                Float,
            );
            s.push(format!("{p}.bias"), &[mult * nf / 2], Float);
            idx += 1;
            for _ in 0..se.n_residual_layers {
                resblock(&mut s, "decoder", idx, mult * nf / 2);
                idx += 1;
            }
            mult /= 2;
        }
        idx += 1; // ELU
        conv(
            &mut s,
            format!("decoder.model.{idx}.conv.conv"),
            se.channels,
            nf,
            se.last_kernel_size,
        );
        let t = &c.transformer;
        let dm = t.d_model;
        for side in ["encoder", "decoder"] {
            for l in 0..t.num_layers {
                let p = format!("{side}_transformer.transformer.layers.{l}.");
                s.push(
                    format!("{p}self_attn.in_proj_weight"),
                    &[3 * dm, dm],
                    Matrix,
                );
                s.push(format!("{p}self_attn.out_proj.weight"), &[dm, dm], Matrix);
                s.push(format!("{p}norm1.weight"), &[dm], Float);
                s.push(format!("{p}norm1.bias"), &[dm], Float);
                s.push(format!("{p}norm2.weight"), &[dm], Float);
                s.push(format!("{p}norm2.bias"), &[dm], Float);
                s.push(format!("{p}linear1.weight"), &[t.ffn_hidden(), dm], Matrix);
                s.push(format!("{p}linear2.weight"), &[dm, t.ffn_hidden()], Matrix);
                if t.layer_scale.is_some() {
                    s.push(format!("{p}layer_scale_1.scale"), &[dm], Float);
                    s.push(format!("{p}layer_scale_2.scale"), &[dm], Float);
                }
            }
        }
        let stride = c.resample_stride();
        s.push(
            "downsample.conv.conv.conv.weight".into(),
            &[se.dimension, se.dimension, 2 * stride],
            Float,
        );
        s.push(
            "upsample.convtr.convtr.convtr.weight".into(),
            &[se.dimension, 1, 2 * stride],
            Float,
        );
        let q = &c.quantizer;
        for (name, n) in [
            ("rvq_first", q.n_q_semantic),
            ("rvq_rest", q.n_q - q.n_q_semantic),
        ] {
            let p = format!("quantizer.{name}.");
            s.push(
                format!("{p}input_proj.weight"),
                &[q.dimension, q.input_dimension, 1],
                Float,
            );
            s.push(
                format!("{p}output_proj.weight"),
                &[q.output_dimension, q.dimension, 1],
                Float,
            );
            for i in 0..n {
                let cb = format!("{p}vq.layers.{i}._codebook.");
                s.push(format!("{cb}_initialized"), &[1], FloatOrFlag);
                s.push(format!("{cb}cluster_usage"), &[q.bins], Float);
                s.push(format!("{cb}embedding_sum"), &[q.bins, q.dimension], Float);
            }
        }
        s
    }
}

impl Weights {
    /// Check the tensors against a schema: every schema tensor present with its shape and an allowed
    /// storage, and nothing else.
    pub fn check(&self, schema: &Schema) -> Result<(), CheckpointError> {
        let missing: Vec<String> = schema
            .tensors
            .iter()
            .filter(|t| !self.entries.contains_key(&t.name))
            .map(|t| t.name.clone())
            .collect();
        if !missing.is_empty() {
            return Err(CheckpointError::MissingTensor { names: missing });
        }
        let by_name: HashMap<&str, _> = schema
            .tensors
            .iter()
            .map(|t| (t.name.as_str(), t))
            .collect();
        let unexpected: Vec<String> = self
            .entries
            .iter()
            .filter(|(n, _)| !by_name.contains_key(n.as_str()))
            .map(|(n, e)| {
                if e.sources.len() == 1 && e.sources[0] == *n {
                    n.clone()
                } else {
                    format!("{n} (from {})", e.sources.join(", "))
                }
            })
            .collect();
        if !unexpected.is_empty() {
            return Err(CheckpointError::UnexpectedTensor { names: unexpected });
        }
        for t in &schema.tensors {
            let e = &self.entries[&t.name];
            if e.shape != t.shape {
                return Err(CheckpointError::ShapeMismatch {
                    name: t.name.clone(),
                    expected: t.shape.clone(),
                    found: e.shape.clone(),
                });
            }
            let ok = match (t.allowed, e.quant) {
                (_, Quant::Plain(DType::F32 | DType::F16 | DType::Bf16)) => true,
                (Allowed::Matrix, Quant::Plain(DType::Q8_0 | DType::Q4_0)) => true,
                (Allowed::Matrix, Quant::Mlx { .. }) => true,
                (Allowed::FloatOrFlag, Quant::Plain(d)) => {
                    matches!(d, DType::Bool | DType::U8 | DType::F64 | DType::I64)
                }
                _ => false,
            };
            if !ok {
                return Err(CheckpointError::DtypeNotAllowed {
                    name: t.name.clone(),
                    dtype: e.quant.name(),
                    allowed: t.allowed.describe().into(),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moshiko_parameter_count() {
        // Architecture reference §2.1: total 7,687,729,152 parameters.
        let s = Schema::lm(&LmConfig::moshiko_v0_1());
        assert_eq!(s.numel(), 7_687_729_152);
        let t = s
            .get("depformer.layers.0.self_attn.in_proj_weight")
            .unwrap();
        assert_eq!(t.shape, vec![24576, 1024]);
        assert_eq!(
            s.get("transformer.layers.31.gating.linear_in.weight")
                .unwrap()
                .shape,
            vec![22528, 4096]
        );
        assert_eq!(
            s.get("depformer.layers.5.gating.7.linear_out.weight")
                .unwrap()
                .shape,
            vec![1024, 2816]
        );
    }

    #[test]
    fn mimi_released_shapes() {
        // Architecture reference §1.9.
        let s = Schema::mimi(&MimiConfig::v0_1());
        let sh = |n: &str| s.get(n).unwrap_or_else(|| panic!("{n}")).shape.clone();
        assert_eq!(sh("encoder.model.0.conv.conv.weight"), vec![64, 1, 7]);
        assert_eq!(sh("encoder.model.12.conv.conv.weight"), vec![1024, 512, 16]);
        assert_eq!(sh("encoder.model.14.conv.conv.weight"), vec![512, 1024, 3]);
        assert_eq!(
            sh("encoder.model.10.block.1.conv.conv.weight"),
            vec![256, 512, 3]
        );
        assert_eq!(sh("decoder.model.0.conv.conv.weight"), vec![1024, 512, 7]);
        assert_eq!(
            sh("decoder.model.2.convtr.convtr.weight"),
            vec![1024, 512, 16]
        );
        assert_eq!(sh("decoder.model.2.convtr.convtr.bias"), vec![512]);
        assert_eq!(
            sh("decoder.model.11.convtr.convtr.weight"),
            vec![128, 64, 8]
        );
        assert_eq!(
            sh("decoder.model.12.block.3.conv.conv.weight"),
            vec![64, 32, 1]
        );
        assert_eq!(sh("decoder.model.14.conv.conv.weight"), vec![1, 64, 3]);
        assert_eq!(sh("upsample.convtr.convtr.convtr.weight"), vec![512, 1, 4]);
        assert_eq!(sh("downsample.conv.conv.conv.weight"), vec![512, 512, 4]);
        assert_eq!(
            sh("quantizer.rvq_rest.vq.layers.30._codebook.embedding_sum"),
            vec![2048, 256]
        );
        assert!(s
            .get("quantizer.rvq_rest.vq.layers.31._codebook.embedding_sum")
            .is_none());
        assert_eq!(
            sh("decoder_transformer.transformer.layers.7.linear1.weight"),
            vec![2048, 512]
        );
        // §1.1: ~96.2 M values.
        let n = s.numel();
        assert!((96_000_000..96_400_000).contains(&n), "{n}");
    }
}
