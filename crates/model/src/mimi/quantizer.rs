//! Split residual vector quantizer (`SplitResidualVectorQuantizer` of `moshi` 0.2.13):
//! one semantic codebook and `n − 1` acoustic codebooks, both fed from the same latent,
//! each with its own 1×1 input/output projections.

use super::conv::matmul;
use kernels::{Matrix, Pool, Scratch};

/// One codebook: centroids `[bins, dim]` (= embedding_sum / max(cluster_usage, 1e-5)) and
/// half their squared norms for the distance search.
#[derive(Debug)]
pub(crate) struct Codebook {
    pub bins: usize,
    pub dim: usize,
    pub centroids: Vec<f32>,
    mat: Matrix,
    half_norms: Vec<f32>,
}

impl Codebook {
    /// From the checkpoint buffers.
    pub fn from_sums(
        bins: usize,
        dim: usize,
        embedding_sum: &[f32],
        cluster_usage: &[f32],
    ) -> Result<Self, super::MimiError> {
        let mut centroids = vec![0.0; bins * dim];
        for b in 0..bins {
            let u = cluster_usage[b].max(1e-5);
            for j in 0..dim {
                centroids[b * dim + j] = embedding_sum[b * dim + j] / u;
            }
        }
        Self::from_centroids(bins, dim, centroids)
    }

    /// From explicit centroids.
    pub fn from_centroids(
        bins: usize,
        dim: usize,
        centroids: Vec<f32>,
    ) -> Result<Self, super::MimiError> {
        let half_norms = (0..bins)
            .map(|b| {
                0.5 * centroids[b * dim..(b + 1) * dim]
                    .iter()
                    .map(|v| v * v)
                    .sum::<f32>()
            })
            .collect();
        let mat = Matrix::from_f32(bins, dim, centroids.clone())
            .map_err(|e| super::MimiError::Config(format!("codebook: {e}")))?;
        Ok(Codebook {
            bins,
            dim,
            centroids,
            mat,
            half_norms,
        })
    }

    /// Nearest centroid (squared Euclidean distance; first index on ties) via
    /// argmin(‖e‖²/2 − x·e), `scores` a scratch of `bins` values.
    fn nearest(
        &self,
        x: &[f32],
        scores: &mut [f32],
        pool: Option<&Pool>,
        scratch: &mut Scratch,
    ) -> usize {
        matmul(&self.mat, x, 1, scores, pool, scratch);
        let mut best = 0;
        let mut bv = f32::INFINITY;
        for (i, (&s, &h)) in scores.iter().zip(&self.half_norms).enumerate() {
            let v = h - s;
            if v < bv {
                bv = v;
                best = i;
            }
        }
        best
    }

    fn row(&self, i: usize) -> &[f32] {
        &self.centroids[i * self.dim..(i + 1) * self.dim]
    }
}

/// A residual VQ with projections (`ResidualVectorQuantizer`, force_projection).
#[derive(Debug)]
pub(crate) struct Rvq {
    /// `[cb_dim, d]`.
    pub input_proj: Matrix,
    /// `[d, cb_dim]`.
    pub output_proj: Matrix,
    pub codebooks: Vec<Codebook>,
}

/// The split quantizer restricted to the codebooks in use.
#[derive(Debug)]
pub(crate) struct SplitRvq {
    pub d: usize,
    pub cb_dim: usize,
    pub first: Rvq,
    pub rest: Rvq,
}

/// Scratch for the quantizer (no allocation per frame).
#[derive(Debug)]
pub(crate) struct QuantScratch {
    x: Vec<f32>,
    u: Vec<f32>,
    acc: Vec<f32>,
    z: Vec<f32>,
    scores: Vec<f32>,
    scratch: Scratch,
}

impl SplitRvq {
    /// Number of codebooks in use (semantic + acoustic).
    pub fn n_q(&self) -> usize {
        1 + self.rest.codebooks.len()
    }

    /// Scratch buffers.
    pub fn scratch(&self) -> QuantScratch {
        let bins = self.first.codebooks[0].bins;
        QuantScratch {
            x: vec![0.0; self.d],
            u: vec![0.0; self.cb_dim],
            acc: vec![0.0; self.cb_dim],
            z: vec![0.0; self.d],
            scores: vec![0.0; bins],
            scratch: Scratch::new(),
        }
    }

    /// Encodes the latent `z` `[d, t]` (conv layout) into `codes[q * t + s]`.
    pub fn encode(
        &self,
        sc: &mut QuantScratch,
        z: &[f32],
        t: usize,
        codes: &mut [u32],
        pool: Option<&Pool>,
    ) {
        let d = self.d;
        for s in 0..t {
            for c in 0..d {
                sc.x[c] = z[c * t + s];
            }
            // semantic
            matmul(
                &self.first.input_proj,
                &sc.x,
                1,
                &mut sc.u,
                pool,
                &mut sc.scratch,
            );
            codes[s] = self.first.codebooks[0].nearest(&sc.u, &mut sc.scores, pool, &mut sc.scratch)
                as u32;
            // acoustic, from the same latent
            matmul(
                &self.rest.input_proj,
                &sc.x,
                1,
                &mut sc.u,
                pool,
                &mut sc.scratch,
            );
            for (j, cb) in self.rest.codebooks.iter().enumerate() {
                let idx = cb.nearest(&sc.u, &mut sc.scores, pool, &mut sc.scratch);
                codes[(j + 1) * t + s] = idx as u32;
                for (r, e) in sc.u.iter_mut().zip(cb.row(idx)) {
                    *r -= *e;
                }
            }
        }
    }

    /// Decodes `codes[q * t + s]` into the latent `out` `[d, t]`.
    pub fn decode(
        &self,
        sc: &mut QuantScratch,
        codes: &[u32],
        t: usize,
        out: &mut [f32],
        pool: Option<&Pool>,
    ) {
        let d = self.d;
        for s in 0..t {
            let c0 = codes[s] as usize;
            matmul(
                &self.first.output_proj,
                self.first.codebooks[0].row(c0),
                1,
                &mut sc.z,
                pool,
                &mut sc.scratch,
            );
            sc.acc.fill(0.0);
            for (j, cb) in self.rest.codebooks.iter().enumerate() {
                let idx = codes[(j + 1) * t + s] as usize;
                for (a, e) in sc.acc.iter_mut().zip(cb.row(idx)) {
                    *a += *e;
                }
            }
            matmul(
                &self.rest.output_proj,
                &sc.acc,
                1,
                &mut sc.x,
                pool,
                &mut sc.scratch,
            );
            for c in 0..d {
                out[c * t + s] = sc.z[c] + sc.x[c];
            }
        }
    }

    /// Codebook size.
    pub fn bins(&self) -> usize {
        self.first.codebooks[0].bins
    }
}
