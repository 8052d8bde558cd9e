//! Property tests: SIMD matrix products against the scalar reference and against an
//! exact f32 product over the dequantized weights, on random (ragged) shapes.
//!
//! Tolerances:
//! * dense f32/bf16/f16, SIMD vs scalar: 1e-5 · Σ|w·x| (summation order only);
//! * quantized, SIMD vs scalar: 1e-5 · Σ|w·x| (same integer sums, same f32 order);
//! * quantized vs exact dequantized product: the activation-quantization bound
//!   Σ_blocks Σ|w − β| · max|x_block| / 254, where β is the block's additive constant
//!   (see [`block_bias`]), plus 1e-5 · (Σ|w·x| + Σ|(w − β)·x|);
//! * the x86 sets against each other (AVX2, AVX2 + AVX-VNNI, AVX-512, each named through
//!   `Matrix::matmul_with`): bitwise, every format; a set this CPU lacks is skipped with a note.

#![allow(clippy::needless_range_loop)]

use half::{bf16, f16};
use kernels::quant::{encode_q4_0, encode_q8_0};
use std::sync::Mutex;

use kernels::{KernelSet, Matrix, Pool, Scratch, Storage, WeightFormat};
use proptest::prelude::*;

use testkit::rng::XorShift as Rng;

fn build(fmt: WeightFormat, rows: usize, cols: usize, w: &[f32]) -> Matrix {
    Matrix::encode(fmt, rows, cols, w).unwrap()
}

fn quantized(fmt: WeightFormat) -> bool {
    matches!(
        fmt,
        WeightFormat::Q8_0 | WeightFormat::Q4_0 | WeightFormat::MlxAffine { .. }
    )
}

/// The constant `β` a quantized block adds to every weight: the kernels multiply the
/// activation codes by `w − β` (the stored code times the scale) and add `β · Σx` from the
/// exact activation sum, so the activation-quantization error scales with `|w − β|`, not
/// `|w|`. Q8_0 has none; Q4_0 stores codes `c ∈ 0..16` for `d·(c − 8)`, so `β = −8d`, which
/// is the dequantized value of largest magnitude (the encoder maps the block's extreme to
/// code 0); the MLX encoder's `β` is the group minimum rounded to bf16.
fn block_bias(fmt: WeightFormat, original_row: &[f32], dequant_block: &[f32], col: usize) -> f32 {
    match fmt {
        WeightFormat::Q4_0 => {
            dequant_block
                .iter()
                .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m })
        }
        WeightFormat::MlxAffine { group, .. } => {
            let g = &original_row[col / group * group..(col / group + 1) * group];
            bf16::from_f32(g.iter().fold(f32::INFINITY, |m, &v| m.min(v))).to_f32()
        }
        _ => 0.0,
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Whether this CPU runs `set`; says once per set and process when it does not (its
/// cross-check is then skipped).
fn available_or_say_why(set: KernelSet) -> bool {
    static SAID: Mutex<Vec<KernelSet>> = Mutex::new(Vec::new());
    if set.available() {
        return true;
    }
    let mut said = SAID.lock().unwrap();
    if !said.contains(&set) {
        said.push(set);
        eprintln!("matrix_props: the {set} kernels are not available on this CPU: their cross-check is skipped");
    }
    false
}

fn check(fmt: WeightFormat, rows: usize, cols: usize, n: usize, seed: u64) {
    let mut rng = Rng(seed | 1);
    let w = rng.vec(rows * cols, 0.5);
    let mut x = rng.vec(n * cols, 2.0);
    if n > 1 {
        // one all-zero block to exercise the zero-scale path
        x[..cols.min(32)].fill(0.0);
    }
    let m = build(fmt, rows, cols, &w);
    let mut sc = Scratch::new();
    let mut y = vec![0f32; n * rows];
    let mut yr = vec![0f32; n * rows];
    m.matmul(&x, n, &mut y, &mut sc);
    m.matmul_reference(&x, n, &mut yr, &mut sc);
    // The x86 sets against each other, each named explicitly (`matmul_with`): the process-wide
    // allow flags would be seen by the other tests of this binary, which run in parallel
    // threads, so a comparison through them could be AVX2 against AVX2. AVX-VNNI computes the
    // plain AVX2 (`vpmaddubsw`) set's integer sums in the same f32 order, and the AVX-512 pair
    // kernels the same integer sums and per-lane f32 operations (its lone tiles run the AVX-VNNI
    // kernel where the CPU has it, else the plain AVX2 one): bitwise equal, every format.
    if available_or_say_why(KernelSet::Avx2) {
        let mut base = vec![f32::NAN; n * rows];
        m.matmul_with(KernelSet::Avx2, &x, n, &mut base, &mut sc)
            .unwrap();
        for set in [KernelSet::Avx2Vnni, KernelSet::Avx512] {
            if !available_or_say_why(set) {
                continue;
            }
            let mut other = vec![f32::NAN; n * rows];
            m.matmul_with(set, &x, n, &mut other, &mut sc).unwrap();
            assert_eq!(
                bits(&other),
                bits(&base),
                "{set} and avx2 paths differ ({fmt:?} {rows}x{cols} n{n})"
            );
        }
    }
    let mut row = vec![0f32; cols];
    for r in 0..rows {
        m.row_f32(r, &mut row);
        for i in 0..n {
            let xi = &x[i * cols..(i + 1) * cols];
            let exact: f64 = row.iter().zip(xi).map(|(a, b)| *a as f64 * *b as f64).sum();
            let mag: f64 = row
                .iter()
                .zip(xi)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            let (a, b) = (y[i * rows + r], yr[i * rows + r]);
            assert!(
                (a - b).abs() as f64 <= 1e-5 * mag + 1e-6,
                "{fmt:?} {rows}x{cols} n{n} r{r} i{i}: simd {a} scalar {b}"
            );
            let mut bound = 1e-5 * mag + 1e-6;
            if quantized(fmt) {
                for (b, (wb, xb)) in row.chunks(32).zip(xi.chunks(32)).enumerate() {
                    let beta = block_bias(fmt, &w[r * cols..(r + 1) * cols], wb, b * 32) as f64;
                    let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                    let shifted: f64 = wb.iter().map(|v| (*v as f64 - beta).abs()).sum();
                    let shifted_mag: f64 = wb
                        .iter()
                        .zip(xb)
                        .map(|(v, x)| ((*v as f64 - beta) * *x as f64).abs())
                        .sum();
                    bound += shifted * amax / 254.0 + 1e-5 * shifted_mag;
                }
            }
            assert!(
                (a as f64 - exact).abs() <= bound,
                "{fmt:?} {rows}x{cols} n{n}: got {a} exact {exact} bound {bound}"
            );
        }
    }
    // Pool with 1..3 threads gives the SIMD result.
    for t in 1..=3 {
        let pool = Pool::new(t);
        let mut yp = vec![0f32; n * rows];
        pool.matmul(&m, &x, n, &mut yp);
        assert_eq!(yp, y, "pool with {t} threads");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn dense_formats(rows in 1usize..20, cols in 1usize..80, n in 1usize..18, seed in any::<u64>()) {
        for fmt in [WeightFormat::F32, WeightFormat::Bf16, WeightFormat::F16] {
            check(fmt, rows, cols, n, seed);
        }
    }

    #[test]
    fn gguf_formats(rows in 1usize..40, blocks in 1usize..6, n in 1usize..10, seed in any::<u64>()) {
        for fmt in [WeightFormat::Q8_0, WeightFormat::Q4_0] {
            check(fmt, rows, blocks * 32, n, seed);
        }
    }

    #[test]
    fn mlx_formats(rows in 1usize..40, groups in 1usize..4, n in 1usize..6, seed in any::<u64>()) {
        for bits in [4u8, 8] {
            for group in [32usize, 64] {
                check(WeightFormat::MlxAffine { bits, group }, rows, groups * 64, n, seed);
            }
        }
    }
}

/// Calls `check(r, c, v)` for every value `v` that `row_f32` decodes from `m`.
fn each_decoded(m: &Matrix, mut check: impl FnMut(usize, usize, f32)) {
    let mut row = vec![0f32; m.cols()];
    for r in 0..m.rows() {
        m.row_f32(r, &mut row);
        for (c, &v) in row.iter().enumerate() {
            check(r, c, v);
        }
    }
}

/// Builds the `fmt` matrix over its GGML encoding `bytes` (`block_bytes` per 32 weights, f16
/// scale first) and calls `check(block, scale, r, c, v)` for every value `v` that `row_f32`
/// decodes, with the block holding weight `(r, c)` and that block's scale.
fn each_ggml_decoded(
    fmt: WeightFormat,
    block_bytes: usize,
    (rows, cols): (usize, usize),
    bytes: &[u8],
    mut check: impl FnMut(&[u8], f32, usize, usize, f32),
) {
    let m = Matrix::from_bytes(fmt, rows, cols, Storage::from_vec(bytes.to_vec())).unwrap();
    each_decoded(&m, |r, c, v| {
        let blk = &bytes[(r * cols + c) / 32 * block_bytes..];
        let d = f16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32();
        check(blk, d, r, c, v)
    });
}

/// Independent decoders of the on-disk layouts, checked against `row_f32`.
#[test]
fn row_f32_matches_on_disk_layouts() {
    let (rows, cols) = (3, 64);
    let mut rng = Rng(42);
    let w = rng.vec(rows * cols, 1.0);
    // Q8_0
    let bytes = encode_q8_0(&w).unwrap();
    each_ggml_decoded(
        WeightFormat::Q8_0,
        34,
        (rows, cols),
        &bytes,
        |blk, d, r, c, v| {
            assert_eq!(v, d * (blk[2 + c % 32] as i8) as f32);
            assert!((v - w[r * cols + c]).abs() <= d * 0.6 + 1e-6);
        },
    );
    // Q4_0
    let bytes = encode_q4_0(&w).unwrap();
    each_ggml_decoded(
        WeightFormat::Q4_0,
        18,
        (rows, cols),
        &bytes,
        |blk, d, r, c, v| {
            let j = c % 32;
            let q = if j < 16 {
                blk[2 + j] & 15
            } else {
                blk[2 + j - 16] >> 4
            };
            assert_eq!(v, d * (q as i32 - 8) as f32);
            assert!((v - w[r * cols + c]).abs() <= d.abs() * 1.01 + 1e-6);
        },
    );
    // MLX 4 and 8 bit, group 32
    for bits in [4u8, 8] {
        let (m, [codes, s, b]) = testkit::mlx_matrix(bits, 32, rows, cols, &w);
        let per_word = 32 / bits as usize;
        each_decoded(&m, |r, c, v| {
            let wi = (r * cols + c) / per_word;
            let word = u32::from_le_bytes([
                codes[4 * wi],
                codes[4 * wi + 1],
                codes[4 * wi + 2],
                codes[4 * wi + 3],
            ]);
            let q = (word >> (bits as usize * (c % per_word))) & ((1 << bits) - 1);
            let gi = (r * cols + c) / 32;
            let sc = bf16::from_bits(u16::from_le_bytes([s[2 * gi], s[2 * gi + 1]])).to_f32();
            let bi = bf16::from_bits(u16::from_le_bytes([b[2 * gi], b[2 * gi + 1]])).to_f32();
            assert!(
                (v - (sc * q as f32 + bi)).abs() <= 1e-6 * (1.0 + bi.abs()),
                "bits {bits}"
            );
        });
    }
}

#[test]
fn constructors_reject_bad_sizes() {
    assert!(Matrix::from_f32(2, 2, vec![0.0; 3]).is_err());
    assert!(Matrix::from_f32(0, 2, vec![]).is_err());
    assert!(Matrix::from_bytes(WeightFormat::Q8_0, 1, 33, Storage::from_vec(vec![0; 34])).is_err());
    assert!(Matrix::from_bytes(WeightFormat::Q8_0, 1, 32, Storage::from_vec(vec![0; 33])).is_err());
    assert!(Matrix::from_bytes(WeightFormat::Q4_0, 2, 32, Storage::from_vec(vec![0; 18])).is_err());
    assert!(Matrix::from_bytes(WeightFormat::Bf16, 2, 3, Storage::from_vec(vec![0; 11])).is_err());
    let v = || Storage::from_vec(vec![0; 16]);
    assert!(Matrix::from_mlx(3, 32, 1, 32, v(), v(), v()).is_err());
    assert!(Matrix::from_mlx(
        4,
        32,
        1,
        32,
        v(),
        Storage::from_vec(vec![0; 2]),
        Storage::from_vec(vec![0; 2])
    )
    .is_ok());
    assert!(Matrix::from_mlx(4, 48, 1, 96, v(), v(), v()).is_err());
}

#[test]
fn unaligned_shared_storage_is_accepted() {
    use std::sync::Arc;
    let w: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let mut bytes = vec![0u8];
    for v in &w {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(bytes);
    let s = Storage::from_shared(owner, 1, 48).unwrap();
    let m = Matrix::from_bytes(WeightFormat::F32, 3, 4, s).unwrap();
    let mut y = [0f32; 3];
    m.matvec(&[1.0, 0.0, 0.0, 1.0], &mut y, &mut Scratch::new());
    assert_eq!(y, [3.0, 11.0, 19.0]);
}

proptest! {
    /// Activation quantization (AVX-512 when available) against the scalar reference: all
    /// outputs bit for bit (the block sums use the same pairwise order).
    #[test]
    fn activation_quantization_matches_reference(
        blocks in 1usize..12,
        seed in any::<u64>(),
        scale in prop_oneof![Just(0.0f32), Just(1e-3f32), Just(1.0f32), Just(300.0f32)],
    ) {
        let mut rng = Rng(seed | 1);
        let mut x = rng.vec(blocks * 32, scale);
        let halves = scale <= 1.0;
        if halves {
            // Exact halves after scaling: element 0 is the max (127), element 1 maps to 63.5.
            x[0] = 127.0;
            x[1] = 63.5;
            x[2] = -0.5;
        }
        let (q, d, s, qs) = kernels::quant::quantize_activations(&x);
        let nb = blocks;
        let (mut q2, mut d2, mut s2, mut qs2) = (vec![0i8; nb * 32], vec![0f32; nb], vec![0f32; nb], vec![0i32; nb]);
        let out = kernels::quant::ActRowOut { q: &mut q2, d: &mut d2, s: &mut s2, qs: &mut qs2 };
        kernels::quant::quantize_act_row_reference(&x, out);
        prop_assert_eq!(&q, &q2);
        prop_assert_eq!(&d, &d2);
        prop_assert_eq!(&qs, &qs2);
        prop_assert_eq!(&s, &s2);
        if halves {
            prop_assert_eq!(q[1], 64);
            prop_assert_eq!(q[2], -1);
        }
    }
}

/// A case the old bound (Σ|w| instead of Σ|w − β|) rejected although the kernels were right.
#[test]
fn q4_0_bound_counts_the_code_offset() {
    check(WeightFormat::Q4_0, 18, 32, 5, 7982705934769587968);
}
