//! Random LM weights at any dimensions ([`SyntheticSource`]), for benchmarks and smoke tests without a
//! checkpoint.

use std::ops::Range;

use kernels::{Matrix, Storage, WeightFormat};
use model::lm::{LmError, TensorSource};
use model::sampling::Rng;

/// The results of a [`TensorSource`].
type Result<T> = std::result::Result<T, LmError>;

/// Random weights in one storage format, generated deterministically from the tensor name.
/// Matrix values are uniform with magnitude about `1/sqrt(cols)` (bf16: magnitude in
/// [2^-7, 2^-6) with random sign); norm weights lie in [0.5, 1.5].
/// Meant for speed measurements (the values do not matter) and smoke tests.
#[derive(Debug, Clone, Copy)]
pub struct SyntheticSource {
    /// Storage format of every matrix (embeddings included).
    pub format: WeightFormat,
    /// Seed mixed into every tensor's generator.
    pub seed: u64,
}

fn name_hash(name: &str) -> u64 {
    // FNV-1a 64.
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

fn fill_bytes(rng: &mut Rng, out: &mut [u8]) {
    let mut chunks = out.chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    let rest = chunks.into_remainder();
    let last = rng.next_u64().to_le_bytes();
    let n = rest.len();
    rest.copy_from_slice(&last[..n]);
}

impl SyntheticSource {
    fn build(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let mut rng = Rng::new(self.seed ^ name_hash(name));
        let amp = 1.0 / (cols as f32).sqrt();
        let uniform = |rng: &mut Rng| ((rng.next_f64() * 2.0 - 1.0) as f32) * amp;
        let n = rows * cols;
        let m = match self.format {
            WeightFormat::F32 => {
                let v: Vec<f32> = (0..n).map(|_| uniform(&mut rng)).collect();
                Matrix::from_f32(rows, cols, v)?
            }
            WeightFormat::Bf16 => {
                // Fast path for full-size benchmarks: random sign and mantissa, exponent fixed so
                // that |w| lies in [2^-7, 2^-6) (the values do not matter for speed).
                let mut bytes = vec![0u8; 2 * n];
                fill_bytes(&mut rng, &mut bytes);
                for c in bytes.chunks_exact_mut(2) {
                    let r = u16::from_le_bytes([c[0], c[1]]);
                    c.copy_from_slice(&((r & 0x807F) | 0x3C00).to_le_bytes());
                }
                Matrix::from_bytes(self.format, rows, cols, Storage::from_vec(bytes))?
            }
            WeightFormat::F16 => {
                let mut bytes = Vec::with_capacity(2 * n);
                for _ in 0..n {
                    let x = uniform(&mut rng);
                    let bits = half::f16::from_f32(x).to_bits();
                    bytes.extend_from_slice(&bits.to_le_bytes());
                }
                Matrix::from_bytes(self.format, rows, cols, Storage::from_vec(bytes))?
            }
            WeightFormat::Q8_0 | WeightFormat::Q4_0 => {
                let q8 = self.format == WeightFormat::Q8_0;
                let (block_bytes, qmax) = if q8 { (34, 127.0) } else { (18, 8.0) };
                if !cols.is_multiple_of(32) {
                    return Err(LmError::Config(format!(
                        "{name}: {cols} columns not a multiple of 32"
                    )));
                }
                let blocks = n / 32;
                let mut bytes = vec![0u8; blocks * block_bytes];
                fill_bytes(&mut rng, &mut bytes);
                let d = half::f16::from_f32(amp / qmax).to_bits().to_le_bytes();
                for b in bytes.chunks_exact_mut(block_bytes) {
                    b[..2].copy_from_slice(&d);
                }
                Matrix::from_bytes(self.format, rows, cols, Storage::from_vec(bytes))?
            }
            WeightFormat::MlxAffine { bits, group } => {
                if !cols.is_multiple_of(group) || !(cols * bits as usize).is_multiple_of(32) {
                    return Err(LmError::Config(format!(
                        "{name}: {cols} columns do not fit MLX q{bits}/g{group}"
                    )));
                }
                let mut w = vec![0u8; rows * cols * bits as usize / 8];
                fill_bytes(&mut rng, &mut w);
                let levels = ((1u32 << bits) - 1) as f32;
                let groups = rows * cols / group;
                let scale = half::bf16::from_f32(2.0 * amp / levels)
                    .to_bits()
                    .to_le_bytes();
                let bias = half::bf16::from_f32(-amp).to_bits().to_le_bytes();
                let scales: Vec<u8> = (0..groups).flat_map(|_| scale).collect();
                let biases: Vec<u8> = (0..groups).flat_map(|_| bias).collect();
                Matrix::from_mlx(
                    bits,
                    group,
                    rows,
                    cols,
                    Storage::from_vec(w),
                    Storage::from_vec(scales),
                    Storage::from_vec(biases),
                )?
            }
        };
        Ok(m)
    }
}

impl TensorSource for SyntheticSource {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        self.build(name, rows, cols)
    }

    fn matrix_rows(&self, name: &str, shape: [usize; 2], take: Range<usize>) -> Result<Matrix> {
        let ([rows, cols], start, n) = (shape, take.start, take.len());
        if start + n > rows {
            return Err(LmError::Shape {
                name: name.to_string(),
                expected: vec![rows, cols],
                got: vec![start + n, cols],
            });
        }
        self.build(&format!("{name}[{start}..]"), n, cols)
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let mut rng = Rng::new(self.seed ^ name_hash(name));
        Ok((0..len).map(|_| 0.5 + rng.next_f64() as f32).collect())
    }
}

#[cfg(test)]
mod tests {
    use kernels::attention::KvDtype;
    use kernels::Pool;
    use model::checkpoint::LmConfig;
    use model::lm::{LmGen, LmModel, LmSpec};
    use model::sampling::{Sampler, SamplerConfig};

    use super::*;

    fn tiny_config() -> LmConfig {
        let path = testkit::fixtures_dir("lm").join("config.json");
        LmConfig::from_json(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    #[test]
    fn synthetic_source_runs_at_any_format() {
        let mut spec = LmSpec::from_config(&tiny_config()).unwrap();
        spec.num_layers = 1;
        for format in [
            kernels::WeightFormat::F32,
            kernels::WeightFormat::Bf16,
            kernels::WeightFormat::Q8_0,
            kernels::WeightFormat::Q4_0,
            kernels::WeightFormat::MlxAffine { bits: 4, group: 32 },
            kernels::WeightFormat::MlxAffine { bits: 8, group: 32 },
        ] {
            let src = SyntheticSource { format, seed: 1 };
            let model = LmModel::from_source(&src, spec.clone()).unwrap();
            assert!(model.streamed_weight_bytes() > 0);
            let pool = Pool::new(1);
            let mut s = Sampler::new(SamplerConfig::seeded(1), 128, 64).unwrap();
            let mut g = LmGen::new(&model, KvDtype::Bf16).unwrap();
            for _ in 0..3 {
                g.step(&model, &[1; 8], &mut s, &pool).unwrap();
            }
            assert!(g.state().text_logits().iter().all(|x| x.is_finite()));
        }
    }
}
