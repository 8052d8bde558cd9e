//! Split residual vector quantizer (`SplitResidualVectorQuantizer` of `moshi` 0.2.13):
//! one semantic codebook and `n − 1` acoustic codebooks, both fed from the same latent,
//! each with its own 1×1 input/output projections.

use super::conv::matmul;
use kernels::{Matrix, Pool, Scratch};

/// One codebook: centroids `[bins, dim]` (= embedding_sum / max(cluster_usage, 1e-5)) and
/// what the nearest-centroid search needs.
///
/// The search screens all centroids with a bf16 copy (half the bytes streamed per frame),
/// then decides among the centroids that the screen cannot rule out with exact f64 dot
/// products of the f32 centroids. The screen's error bound is rigorous (bf16 rounding
/// ≤ 2⁻⁸ relative per weight, f32 accumulation ≤ γ_dim, Cauchy–Schwarz), so the result is
/// the argmin of the f64-evaluated distance, i.e. at least as exact as a full f32 search.
#[derive(Debug)]
pub(crate) struct Codebook {
    pub bins: usize,
    pub dim: usize,
    pub centroids: Vec<f32>,
    /// bf16 copy of the centroids `[bins, dim]` for the screen.
    screen: Matrix,
    /// ½‖c‖² per centroid, f32 (screen) and f64 (exact decision).
    half_norms: Vec<f32>,
    half_norms64: Vec<f64>,
    /// Screen error per unit of ‖x‖: (2⁻⁸ + 2γ_dim)·‖c‖ + margin, per centroid.
    err_per_x: Vec<f32>,
}

/// f32 → bf16 bits, round to nearest even (finite inputs).
fn bf16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
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
        if let Some(i) = centroids.iter().position(|v| !v.is_finite()) {
            return Err(super::MimiError::NonFinite {
                name: format!(
                    "codebook centroid {} (bins {bins}, dim {dim})",
                    i / dim.max(1)
                ),
            });
        }
        let sq64: Vec<f64> = (0..bins)
            .map(|b| {
                centroids[b * dim..(b + 1) * dim]
                    .iter()
                    .map(|&v| v as f64 * v as f64)
                    .sum::<f64>()
            })
            .collect();
        let half_norms64: Vec<f64> = sq64.iter().map(|s| 0.5 * s).collect();
        let half_norms = half_norms64.iter().map(|&h| h as f32).collect();
        // |c̃·x − c·x| ≤ 2⁻⁸‖c‖‖x‖ (bf16 rounding of the weights) + γ(1+2⁻⁸)‖c‖‖x‖ (f32
        // accumulation of the screen), γ = n·u/(1 − n·u). Another 2⁻⁸(1+2⁻⁸)‖c‖‖x‖ covers a bf16
        // kernel that would also round the activations (`vdpbf16ps`; kernels currently widen
        // bf16 weights exactly and keep x in f32). Doubled for the f32 arithmetic of the bound.
        let u = f32::EPSILON as f64 / 2.0;
        let n = dim as f64;
        let gamma = n * u / (1.0 - n * u).max(0.5);
        let e8 = 2f64.powi(-8);
        let rel = 2.0 * (e8 + e8 * (1.0 + e8) + gamma * (1.0 + e8) * (1.0 + e8));
        let err_per_x = sq64.iter().map(|s| (rel * s.sqrt()) as f32).collect();
        let bytes: Vec<u8> = centroids
            .iter()
            .flat_map(|&v| bf16_bits(v).to_le_bytes())
            .collect();
        let screen = Matrix::from_bytes(
            kernels::WeightFormat::Bf16,
            bins,
            dim,
            kernels::Storage::from_vec(bytes),
        )
        .map_err(|e| super::MimiError::Config(format!("codebook: {e}")))?;
        Ok(Codebook {
            bins,
            dim,
            centroids,
            screen,
            half_norms,
            half_norms64,
            err_per_x,
        })
    }

    /// Nearest centroid (squared Euclidean distance; first index on ties) via
    /// argmin(‖e‖²/2 − x·e), `scores` a scratch of `bins` values: bf16 screen, then the
    /// exact f64 decision among the centroids within the screen's error bound of the best.
    #[cfg(test)]
    fn nearest(
        &self,
        x: &[f32],
        scores: &mut [f32],
        pool: Option<&Pool>,
        scratch: &mut Scratch,
    ) -> usize {
        matmul(&self.screen, x, 1, scores, pool, scratch);
        self.decide(x, scores)
    }

    /// The exact decision of [`Codebook::nearest`] for one row `x`, given its screened
    /// scores (`bins` values of the bf16 product).
    fn decide(&self, x: &[f32], scores: &[f32]) -> usize {
        let xn = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt() as f32;
        // Per centroid: screened value v = h − s̃ and its error bound e. Every centroid whose
        // lower bound v − e reaches the smallest upper bound can be the nearest one.
        let err = |i: usize, s: f32| {
            let h = self.half_norms[i];
            self.err_per_x[i] * xn + 4.0 * f32::EPSILON * (h.abs() + s.abs()) + 1e-30
        };
        let mut upper = f32::INFINITY;
        for (i, (&s, &h)) in scores.iter().zip(&self.half_norms).enumerate() {
            upper = upper.min(h - s + err(i, s));
        }
        let mut best = usize::MAX;
        let mut bv = f64::INFINITY;
        for (i, (&s, &h)) in scores.iter().zip(&self.half_norms).enumerate() {
            if h - s - err(i, s) <= upper {
                let v = self.value_exact(i, x);
                if v < bv {
                    bv = v;
                    best = i;
                }
            }
        }
        // Non-finite input (NaN latent): no candidate compares; keep the old answer, 0.
        if best == usize::MAX {
            0
        } else {
            best
        }
    }

    /// Nearest centroids of the `n` rows of `x` (`[n, dim]`) into `idx`: one screen product
    /// for all rows (the bf16 centroids are read once), then each row's exact decision.
    fn nearest_rows(
        &self,
        x: &[f32],
        n: usize,
        scores: &mut [f32],
        idx: &mut [usize],
        pool: Option<&Pool>,
        scratch: &mut Scratch,
    ) {
        let (bins, dim) = (self.bins, self.dim);
        matmul(&self.screen, &x[..n * dim], n, scores, pool, scratch);
        for (r, i) in idx[..n].iter_mut().enumerate() {
            *i = self.decide(
                &x[r * dim..(r + 1) * dim],
                &scores[r * bins..(r + 1) * bins],
            );
        }
    }

    /// `½‖c_i‖² − x·c_i` evaluated in f64 (the products of two f32 are exact in f64).
    fn value_exact(&self, i: usize, x: &[f32]) -> f64 {
        let dot: f64 = self
            .row(i)
            .iter()
            .zip(x)
            .map(|(&c, &v)| c as f64 * v as f64)
            .sum();
        self.half_norms64[i] - dot
    }

    pub(crate) fn row(&self, i: usize) -> &[f32] {
        &self.centroids[i * self.dim..(i + 1) * self.dim]
    }

    /// The nearest centroid to `x` by the f64-evaluated `½‖c‖² − x·c` over all centroids (first
    /// index on ties; 0 for a non-finite `x`): the answer [`Codebook::decide`] gives, without
    /// the screen.
    pub(crate) fn nearest_exact(&self, x: &[f32]) -> usize {
        let mut best = 0;
        let mut bv = f64::INFINITY;
        for i in 0..self.bins {
            let v = self.value_exact(i, x);
            if v < bv {
                bv = v;
                best = i;
            }
        }
        best
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

/// Scratch for the quantizer (no allocation per frame), for up to `rows` latent steps per call.
#[derive(Debug)]
pub(crate) struct QuantScratch {
    x: Vec<f32>,
    u: Vec<f32>,
    acc: Vec<f32>,
    z: Vec<f32>,
    scores: Vec<f32>,
    idx: Vec<usize>,
    scratch: Scratch,
}

impl SplitRvq {
    /// Number of codebooks in use (semantic + acoustic).
    pub fn n_q(&self) -> usize {
        1 + self.rest.codebooks.len()
    }

    /// Scratch buffers for calls of at most `rows` latent steps (all streams together).
    pub fn scratch(&self, rows: usize) -> QuantScratch {
        let bins = self.first.codebooks[0].bins;
        QuantScratch {
            x: vec![0.0; rows * self.d],
            u: vec![0.0; rows * self.cb_dim],
            acc: vec![0.0; rows * self.cb_dim],
            z: vec![0.0; rows * self.d],
            scores: vec![0.0; rows * bins],
            idx: vec![0; rows],
            scratch: Scratch::new(),
        }
    }

    /// Encodes the latent `z` `[d, m·t]` (conv layout, stream j's steps at `j·t`) into
    /// `codes[j·nq·t + q·t + s]`. Every product takes the `m·t` rows at once.
    pub fn encode(
        &self,
        sc: &mut QuantScratch,
        z: &[f32],
        m: usize,
        t: usize,
        codes: &mut [u32],
        pool: Option<&Pool>,
    ) {
        let (d, cb, nq) = (self.d, self.cb_dim, self.n_q());
        let n = m * t;
        for r in 0..n {
            for c in 0..d {
                sc.x[r * d + c] = z[c * n + r];
            }
        }
        let code = |r: usize, q: usize| (r / t) * nq * t + q * t + r % t;
        // semantic
        matmul(
            &self.first.input_proj,
            &sc.x[..n * d],
            n,
            &mut sc.u,
            pool,
            &mut sc.scratch,
        );
        let first = &self.first.codebooks[0];
        first.nearest_rows(&sc.u, n, &mut sc.scores, &mut sc.idx, pool, &mut sc.scratch);
        for r in 0..n {
            codes[code(r, 0)] = sc.idx[r] as u32;
        }
        // acoustic, from the same latent
        matmul(
            &self.rest.input_proj,
            &sc.x[..n * d],
            n,
            &mut sc.u,
            pool,
            &mut sc.scratch,
        );
        for (j, book) in self.rest.codebooks.iter().enumerate() {
            book.nearest_rows(&sc.u, n, &mut sc.scores, &mut sc.idx, pool, &mut sc.scratch);
            for r in 0..n {
                let i = sc.idx[r];
                codes[code(r, j + 1)] = i as u32;
                for (v, e) in sc.u[r * cb..(r + 1) * cb].iter_mut().zip(book.row(i)) {
                    *v -= *e;
                }
            }
        }
    }

    /// Decodes `codes[j·nq·t + q·t + s]` into the latent `out` `[d, m·t]`.
    pub fn decode(
        &self,
        sc: &mut QuantScratch,
        codes: &[u32],
        m: usize,
        t: usize,
        out: &mut [f32],
        pool: Option<&Pool>,
    ) {
        let (d, cb, nq) = (self.d, self.cb_dim, self.n_q());
        let n = m * t;
        let code = |r: usize, q: usize| codes[(r / t) * nq * t + q * t + r % t] as usize;
        let first = &self.first.codebooks[0];
        for r in 0..n {
            sc.u[r * cb..(r + 1) * cb].copy_from_slice(first.row(code(r, 0)));
            let acc = &mut sc.acc[r * cb..(r + 1) * cb];
            acc.fill(0.0);
            for (j, book) in self.rest.codebooks.iter().enumerate() {
                for (a, e) in acc.iter_mut().zip(book.row(code(r, j + 1))) {
                    *a += *e;
                }
            }
        }
        matmul(
            &self.first.output_proj,
            &sc.u[..n * cb],
            n,
            &mut sc.z,
            pool,
            &mut sc.scratch,
        );
        matmul(
            &self.rest.output_proj,
            &sc.acc[..n * cb],
            n,
            &mut sc.x,
            pool,
            &mut sc.scratch,
        );
        for r in 0..n {
            for c in 0..d {
                out[c * n + r] = sc.z[r * d + c] + sc.x[r * d + c];
            }
        }
    }

    /// Codebook size.
    pub fn bins(&self) -> usize {
        self.first.codebooks[0].bins
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use testkit::rng::XorShift as Rng;

    /// argmin over all centroids of ½‖c‖² − c·x in f64 (first index on ties).
    fn brute(cb: &Codebook, x: &[f32]) -> usize {
        let mut best = 0;
        let mut bv = f64::INFINITY;
        for i in 0..cb.bins {
            let r = cb.row(i);
            let h: f64 = 0.5 * r.iter().map(|&v| v as f64 * v as f64).sum::<f64>();
            let d: f64 = r.iter().zip(x).map(|(&c, &v)| c as f64 * v as f64).sum();
            if h - d < bv {
                bv = h - d;
                best = i;
            }
        }
        best
    }

    #[test]
    fn screened_search_equals_exact_search_also_on_near_ties() {
        let (bins, dim) = (512, 64);
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        // Centroids of very different scales, plus pairs that differ in one low bit only.
        let mut c: Vec<f32> = (0..bins * dim)
            .map(|i| rng.next_f32() * if (i / dim) % 3 == 0 { 8.0 } else { 0.5 })
            .collect();
        for p in 0..32 {
            let (a, b) = (2 * p, 2 * p + 1);
            for j in 0..dim {
                c[b * dim + j] = c[a * dim + j];
            }
            let j = p % dim;
            c[b * dim + j] = f32::from_bits(c[a * dim + j].to_bits() ^ 1);
        }
        let cb = Codebook::from_centroids(bins, dim, c.clone()).unwrap();
        let mut scores = vec![0.0; bins];
        let mut scratch = Scratch::new();
        let pool = Pool::new(2);
        for trial in 0..600 {
            let x: Vec<f32> = match trial % 3 {
                // random points
                0 => (0..dim).map(|_| rng.next_f32() * 4.0).collect(),
                // right next to a centroid
                1 => {
                    let i = (trial * 7) % bins;
                    (0..dim)
                        .map(|j| c[i * dim + j] + rng.next_f32() * 1e-3)
                        .collect()
                }
                // midpoint of two centroids (a near tie) plus a tiny nudge
                _ => {
                    let (a, b) = ((trial * 13) % bins, (trial * 31 + 1) % bins);
                    (0..dim)
                        .map(|j| 0.5 * (c[a * dim + j] + c[b * dim + j]) + rng.next_f32() * 1e-6)
                        .collect()
                }
            };
            let want = brute(&cb, &x);
            let p = (trial % 2 == 0).then_some(&pool);
            assert_eq!(
                cb.nearest(&x, &mut scores, p, &mut scratch),
                want,
                "trial {trial}"
            );
        }
    }

    #[test]
    fn non_finite_centroids_are_refused() {
        let mut c = vec![0.5f32; 4 * 8];
        c[13] = f32::NAN;
        assert!(matches!(
            Codebook::from_centroids(4, 8, c),
            Err(crate::mimi::MimiError::NonFinite { .. })
        ));
        let r = Codebook::from_sums(2, 2, &[1e38, 1.0, 1.0, 1.0], &[1e-9, 1.0]);
        assert!(matches!(r, Err(crate::mimi::MimiError::NonFinite { .. })));
    }
}
