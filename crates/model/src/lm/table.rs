//! The LM's weight table: every tensor the model reads (canonical Kyutai PyTorch name, shape, the
//! per-step rows of the stacked Depformer attention weights), written once. The CPU's
//! [`LmModel`](super::LmModel) and every device backend load their weights by mapping this table
//! ([`LmTensors::try_map`]), each with its own packing; none of them lists the tensors again.

use std::ops::Range;

use super::spec::LmSpec;

/// A matrix of the table: rows `take` (all rows when `None`) of the `[rows, cols]` tensor `name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatrixRef {
    /// Canonical tensor name.
    pub name: String,
    /// Shape of the whole tensor, `[rows, cols]` (trailing dimensions flattened).
    pub shape: [usize; 2],
    /// The rows read (one Depformer step of a stacked tensor), or `None` for the whole tensor.
    pub take: Option<Range<usize>>,
    /// A gated FFN input: its first half of rows is the gate (through SiLU), the second the value
    /// (a device may reorder whole rows to fuse the gate into the product).
    pub gated: bool,
}

impl MatrixRef {
    fn whole(name: String, rows: usize, cols: usize) -> MatrixRef {
        MatrixRef {
            name,
            shape: [rows, cols],
            take: None,
            gated: false,
        }
    }

    /// Rows of the matrix read.
    pub fn rows(&self) -> usize {
        self.take.as_ref().map_or(self.shape[0], Range::len)
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.shape[1]
    }
}

/// A vector of the table (an RMS-norm weight; `[1, 1, len]` tensors are accepted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VectorRef {
    /// Canonical tensor name.
    pub name: String,
    /// Number of values.
    pub len: usize,
}

/// The four projections of one transformer layer (of one Depformer step).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Projections<M> {
    /// Fused Q, K, V projection `[3·dim, dim]`.
    pub in_proj: M,
    /// Attention output projection `[dim, dim]`.
    pub out_proj: M,
    /// Gated FFN input `[2·hidden, dim]` (gate half first).
    pub lin_in: M,
    /// FFN output `[dim, hidden]`.
    pub lin_out: M,
}

impl<M> Projections<M> {
    /// The four projections, in the order of the fields.
    pub fn each(&self) -> [&M; 4] {
        [&self.in_proj, &self.out_proj, &self.lin_in, &self.lin_out]
    }

    /// Each projection through `f`, in the order of the fields.
    pub fn try_map<'a, M2, E>(
        &'a self,
        mut f: impl FnMut(&'a M) -> Result<M2, E>,
    ) -> Result<Projections<M2>, E> {
        Ok(Projections {
            in_proj: f(&self.in_proj)?,
            out_proj: f(&self.out_proj)?,
            lin_in: f(&self.lin_in)?,
            lin_out: f(&self.lin_out)?,
        })
    }
}

/// One temporal layer: its two RMS-norm weights and its projections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer<M, V> {
    /// Attention-block RMS-norm weight `[dim]`.
    pub norm1: V,
    /// Feed-forward-block RMS-norm weight `[dim]`.
    pub norm2: V,
    /// The projections.
    pub proj: Projections<M>,
}

/// One Depformer layer: norms shared by the steps, projections per step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DepLayer<M, V> {
    /// Attention-block RMS-norm weight `[dep_dim]`.
    pub norm1: V,
    /// Feed-forward-block RMS-norm weight `[dep_dim]`.
    pub norm2: V,
    /// The projections of each step `0..dep_q`.
    pub steps: Vec<Projections<M>>,
}

/// Every weight of the LM, as matrices `M` and vectors `V`: [`LmTensors::table`] is the table
/// itself ([`MatrixRef`], [`VectorRef`]); a loader maps it to its own types (the CPU's
/// `kernels::Matrix` and `Vec<f32>`, a device's buffers). With `dep_q = 0` (speech-to-text) the
/// Depformer parts are empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LmTensors<M, V> {
    /// Text embedding table `[text_card + 1, dim]`.
    pub text_emb: M,
    /// Audio embedding tables `0..n_q`, `[card + 1, dim]`.
    pub audio_emb: Vec<M>,
    /// Temporal layers.
    pub layers: Vec<Layer<M, V>>,
    /// Final RMS-norm weight `[dim]`.
    pub out_norm: V,
    /// Text head `[text_card, dim]`.
    pub text_linear: M,
    /// Depformer input projection of each step `[dep_dim, dim]`.
    pub dep_in: Vec<M>,
    /// Embedding of each Depformer step's previous token: the text table for step 0
    /// (`[text_card + 1, dep_dim]`), else audio table `k − 1` (`[card + 1, dep_dim]`).
    pub dep_token_emb: Vec<M>,
    /// Depformer layers.
    pub dep_layers: Vec<DepLayer<M, V>>,
    /// Codebook head of each Depformer step `[card, dep_dim]`.
    pub dep_linear: Vec<M>,
}

impl LmTensors<MatrixRef, VectorRef> {
    /// The table of the model of `spec`: which tensor holds each weight, and its shape.
    pub fn table(spec: &LmSpec) -> Self {
        let (d, dd, k) = (spec.dim, spec.dep_dim, spec.dep_q);
        let m = MatrixRef::whole;
        let v = |name: String, len: usize| VectorRef { name, len };
        let gated = |name: String, rows: usize, cols: usize| MatrixRef {
            gated: true,
            ..m(name, rows, cols)
        };
        let layers = (0..spec.num_layers)
            .map(|l| {
                let p = format!("transformer.layers.{l}");
                Layer {
                    norm1: v(format!("{p}.norm1.alpha"), d),
                    norm2: v(format!("{p}.norm2.alpha"), d),
                    proj: Projections {
                        in_proj: m(format!("{p}.self_attn.in_proj_weight"), 3 * d, d),
                        out_proj: m(format!("{p}.self_attn.out_proj.weight"), d, d),
                        lin_in: gated(format!("{p}.gating.linear_in.weight"), 2 * spec.hidden, d),
                        lin_out: m(format!("{p}.gating.linear_out.weight"), d, spec.hidden),
                    },
                }
            })
            .collect();
        let dep_layers = (0..spec.dep_layers)
            .map(|j| {
                let p = format!("depformer.layers.{j}");
                // The attention projections of all steps are stacked in one tensor each.
                let rows_of = |name: &str, per_step: usize, s: usize| MatrixRef {
                    take: Some(s * per_step..(s + 1) * per_step),
                    ..m(format!("{p}.self_attn.{name}"), k * per_step, dd)
                };
                DepLayer {
                    norm1: v(format!("{p}.norm1.alpha"), dd),
                    norm2: v(format!("{p}.norm2.alpha"), dd),
                    steps: (0..k)
                        .map(|s| Projections {
                            in_proj: rows_of("in_proj_weight", 3 * dd, s),
                            out_proj: rows_of("out_proj.weight", dd, s),
                            lin_in: gated(
                                format!("{p}.gating.{s}.linear_in.weight"),
                                2 * spec.dep_hidden,
                                dd,
                            ),
                            lin_out: m(
                                format!("{p}.gating.{s}.linear_out.weight"),
                                dd,
                                spec.dep_hidden,
                            ),
                        })
                        .collect(),
                }
            })
            .collect();
        LmTensors {
            text_emb: m("text_emb.weight".into(), spec.text_card + 1, d),
            audio_emb: (0..spec.n_q)
                .map(|i| m(format!("emb.{i}.weight"), spec.card + 1, d))
                .collect(),
            layers,
            out_norm: v("out_norm.alpha".into(), d),
            text_linear: m("text_linear.weight".into(), spec.text_card, d),
            dep_in: (0..k)
                .map(|i| m(format!("depformer_in.{i}.weight"), dd, d))
                .collect(),
            dep_token_emb: (0..k)
                .map(|i| match i {
                    0 => m("depformer_text_emb.weight".into(), spec.text_card + 1, dd),
                    _ => m(format!("depformer_emb.{}.weight", i - 1), spec.card + 1, dd),
                })
                .collect(),
            dep_layers,
            dep_linear: (0..k)
                .map(|i| m(format!("linears.{i}.weight"), spec.card, dd))
                .collect(),
        }
    }
}

/// `f` over every element of `v` in order, up to the first error.
fn map_all<'a, T, U, E>(v: &'a [T], f: impl FnMut(&'a T) -> Result<U, E>) -> Result<Vec<U>, E> {
    v.iter().map(f).collect()
}

impl<M, V> LmTensors<M, V> {
    /// Every matrix through `fm` and every vector through `fv`, in the load order (the order the
    /// first failing tensor is reported in): embeddings, temporal layers (norms, then
    /// projections), out norm, text head, then the Depformer's input projections, token
    /// embeddings, layers (each step's projections, then the norms) and heads.
    pub fn try_map<'a, M2, V2, E>(
        &'a self,
        mut fm: impl FnMut(&'a M) -> Result<M2, E>,
        mut fv: impl FnMut(&'a V) -> Result<V2, E>,
    ) -> Result<LmTensors<M2, V2>, E> {
        let text_emb = fm(&self.text_emb)?;
        let audio_emb = map_all(&self.audio_emb, &mut fm)?;
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            let (norm1, norm2) = (fv(&l.norm1)?, fv(&l.norm2)?);
            layers.push(Layer {
                norm1,
                norm2,
                proj: l.proj.try_map(&mut fm)?,
            });
        }
        let out_norm = fv(&self.out_norm)?;
        let text_linear = fm(&self.text_linear)?;
        let dep_in = map_all(&self.dep_in, &mut fm)?;
        let dep_token_emb = map_all(&self.dep_token_emb, &mut fm)?;
        let mut dep_layers = Vec::with_capacity(self.dep_layers.len());
        for l in &self.dep_layers {
            let steps = map_all(&l.steps, |p| p.try_map(&mut fm))?;
            dep_layers.push(DepLayer {
                norm1: fv(&l.norm1)?,
                norm2: fv(&l.norm2)?,
                steps,
            });
        }
        let dep_linear = map_all(&self.dep_linear, &mut fm)?;
        Ok(LmTensors {
            text_emb,
            audio_emb,
            layers,
            out_norm,
            text_linear,
            dep_in,
            dep_token_emb,
            dep_layers,
            dep_linear,
        })
    }

    /// The matrices in load order (see [`LmTensors::try_map`]).
    pub fn matrices(&self) -> Vec<&M> {
        let mut out = Vec::new();
        let _ = self.try_map::<(), (), ()>(
            |m| {
                out.push(m);
                Ok(())
            },
            |_| Ok(()),
        );
        out
    }

    /// The matrices one frame streams whole (every projection of the temporal and Depformer layers,
    /// the text head, the Depformer's input projections and codebook heads): all but the embedding
    /// tables, which a frame reads a row of.
    pub fn streamed(&self) -> Vec<&M> {
        let mut out = vec![&self.text_linear];
        out.extend(self.layers.iter().flat_map(|l| l.proj.each()));
        out.extend(self.dep_in.iter().chain(&self.dep_linear));
        out.extend(
            self.dep_layers
                .iter()
                .flat_map(|l| l.steps.iter().flat_map(Projections::each)),
        );
        out
    }

    /// The matrix whose format names the model's: the first temporal layer's input projection, or
    /// the text head of a model without layers.
    pub fn format_matrix(&self) -> &M {
        self.layers
            .first()
            .map_or(&self.text_linear, |l| &l.proj.in_proj)
    }

    /// The vectors in load order (see [`LmTensors::try_map`]).
    pub fn vectors(&self) -> Vec<&V> {
        let mut out = Vec::new();
        let _ = self.try_map::<(), (), ()>(
            |_| Ok(()),
            |v| {
                out.push(v);
                Ok(())
            },
        );
        out
    }

    /// Each matrix and vector paired with the one at the same place of `other` (the same model's
    /// tensors in other types, e.g. the table and a loaded model); `None` when the two hold
    /// different numbers of matrices or vectors.
    #[allow(clippy::type_complexity)]
    pub fn zip<'a, M2, V2>(
        &'a self,
        other: &'a LmTensors<M2, V2>,
    ) -> Option<LmTensors<(&'a M, &'a M2), (&'a V, &'a V2)>> {
        let (mut ms, mut vs) = (other.matrices().into_iter(), other.vectors().into_iter());
        let z = self
            .try_map(
                |m| ms.next().map(|o| (m, o)).ok_or(()),
                |v| vs.next().map(|o| (v, o)).ok_or(()),
            )
            .ok()?;
        (ms.next().is_none() && vs.next().is_none()).then_some(z)
    }
}

#[cfg(test)]
mod tests {
    use crate::checkpoint::Bundle;
    use crate::lm::tests::fixture_dir;
    use crate::lm::LmModel;

    /// What a device loader learns from the table alone is what the CPU model reports: the bytes a
    /// frame streams and the weights' format.
    #[test]
    fn the_streamed_and_format_matrices_are_the_cpu_models() {
        let b = Bundle::open(&fixture_dir()).unwrap();
        let m = LmModel::load(&b.lm_weights().unwrap(), &b.config.lm).unwrap();
        let t = m.tensors();
        let bytes: usize = t.streamed().iter().map(|w| w.weight_bytes()).sum();
        assert_eq!(bytes, m.streamed_weight_bytes());
        assert_eq!(t.format_matrix().format(), m.weight_format());
    }
}
