//! Block quantization helpers: activation quantization (internal) and encoders that
//! produce on-disk GGUF / MLX byte layouts from f32 values (for tests, benchmarks and
//! tools that write synthetic checkpoints).

use half::{bf16, f16};

use crate::KernelError;

/// Number of values in a quantization block (GGUF Q8_0/Q4_0 and activation blocks).
pub const QK: usize = 32;

/// Quantizes one activation row to signed 8-bit blocks of 32 values.
/// Writes codes `q`, scales `d` (f32, `max|x|/127`), exact f32 block sums `s` and code
/// sums `qs`. `x.len()` must be a multiple of 32. Uses AVX-512 when allowed (same codes,
/// results as [`quantize_act_row_reference`], bit for bit).
pub(crate) fn quantize_act_row(
    x: &[f32],
    q: &mut [i8],
    d: &mut [f32],
    s: &mut [f32],
    qs: &mut [i32],
) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::avx512() {
        let nb = x.len() / QK;
        assert!(q.len() >= nb * QK && d.len() >= nb && s.len() >= nb && qs.len() >= nb);
        // SAFETY: AVX-512 detected; lengths checked above.
        return unsafe { quantize_act_row_avx512(x, q, d, s, qs) };
    }
    quantize_act_row_reference(x, q, d, s, qs)
}

/// Rounds half away from zero without a libm call (`|c| < 2^31`).
#[inline]
fn round_away(c: f32) -> i32 {
    let t = c as i32; // truncation toward zero
    let f = c - t as f32; // exact
    if f >= 0.5 {
        t + 1
    } else if f <= -0.5 {
        t - 1
    } else {
        t
    }
}

/// Sum of 32 values in a fixed pairwise order (lanes `i` and `i + 16`, then halves of 8,
/// 4, 2, 1), shared by the scalar and SIMD quantizers so their block sums are bitwise equal.
#[inline]
fn block_sum(xb: &[f32]) -> f32 {
    let mut l = [0f32; 16];
    for i in 0..16 {
        l[i] = xb[i] + xb[i + 16];
    }
    tree16(&mut l)
}

#[inline]
fn tree16(l: &mut [f32; 16]) -> f32 {
    let mut w = 8;
    while w > 0 {
        for i in 0..w {
            l[i] += l[i + w];
        }
        w /= 2;
    }
    l[0]
}

/// Scalar reference of the activation quantizer of the matrix products (see [`quantize_activations`]).
pub fn quantize_act_row_reference(
    x: &[f32],
    q: &mut [i8],
    d: &mut [f32],
    s: &mut [f32],
    qs: &mut [i32],
) {
    debug_assert_eq!(x.len() % QK, 0);
    for (b, xb) in x.chunks_exact(QK).enumerate() {
        let mut amax = 0f32;
        for &v in xb {
            amax = amax.max(v.abs());
        }
        let sum = block_sum(xb);
        let db = amax / 127.0;
        let id = if db > 0.0 { 1.0 / db } else { 0.0 };
        let mut qsum = 0i32;
        for (o, &v) in q[b * QK..(b + 1) * QK].iter_mut().zip(xb) {
            let c = round_away((v * id).clamp(-127.0, 127.0)) as i8;
            *o = c;
            qsum += c as i32;
        }
        d[b] = db;
        s[b] = sum;
        qs[b] = qsum;
    }
}

/// Public entry to the activation quantizer (dispatching like the matrix products), for
/// property tests: returns `(codes, scales, block sums, code sums)`.
pub fn quantize_activations(x: &[f32]) -> (Vec<i8>, Vec<f32>, Vec<f32>, Vec<i32>) {
    let nb = x.len() / QK;
    let (mut q, mut d, mut s, mut qs) =
        (vec![0; nb * QK], vec![0.0; nb], vec![0.0; nb], vec![0; nb]);
    quantize_act_row(&x[..nb * QK], &mut q, &mut d, &mut s, &mut qs);
    (q, d, s, qs)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn quantize_act_row_avx512(
    x: &[f32],
    q: &mut [i8],
    d: &mut [f32],
    s: &mut [f32],
    qs: &mut [i32],
) {
    use std::arch::x86_64::*;
    let nb = x.len() / QK;
    let abs_mask = _mm512_set1_epi32(0x7fff_ffff);
    let half = _mm512_set1_ps(0.5);
    let lim = _mm512_set1_ps(127.0);
    for b in 0..nb {
        let p = x.as_ptr().add(b * QK);
        let v0 = _mm512_loadu_ps(p);
        let v1 = _mm512_loadu_ps(p.add(16));
        let a0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v0), abs_mask));
        let a1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v1), abs_mask));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
        let db = amax / 127.0;
        let id = if db > 0.0 { 1.0 / db } else { 0.0 };
        let idv = _mm512_set1_ps(id);
        let mut codes = [_mm_setzero_si128(); 2];
        let mut csum = _mm512_setzero_si512();
        for (k, v) in [v0, v1].into_iter().enumerate() {
            let c = _mm512_min_ps(
                _mm512_max_ps(
                    _mm512_mul_ps(v, idv),
                    _mm512_sub_ps(_mm512_setzero_ps(), lim),
                ),
                lim,
            );
            let t = _mm512_cvttps_epi32(c);
            let f = _mm512_sub_ps(c, _mm512_cvtepi32_ps(t));
            let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(f, half);
            let dn = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(f, _mm512_sub_ps(_mm512_setzero_ps(), half));
            let one = _mm512_set1_epi32(1);
            let t = _mm512_mask_add_epi32(t, up, t, one);
            let t = _mm512_mask_sub_epi32(t, dn, t, one);
            csum = _mm512_add_epi32(csum, t);
            codes[k] = _mm512_cvtepi32_epi8(t);
        }
        let qp = q.as_mut_ptr().add(b * QK) as *mut __m128i;
        _mm_storeu_si128(qp, codes[0]);
        _mm_storeu_si128(qp.add(1), codes[1]);
        *d.get_unchecked_mut(b) = db;
        let mut l = [0f32; 16];
        _mm512_storeu_ps(l.as_mut_ptr(), _mm512_add_ps(v0, v1));
        *s.get_unchecked_mut(b) = tree16(&mut l);
        *qs.get_unchecked_mut(b) = _mm512_reduce_add_epi32(csum);
    }
}

/// Encodes f32 values (row-major, each row a multiple of 32 long) as GGUF Q8_0 blocks
/// (f16 scale `max|x|/127` + 32 signed codes, rounded half away from zero).
pub fn encode_q8_0(values: &[f32]) -> Result<Vec<u8>, KernelError> {
    if !values.len().is_multiple_of(QK) {
        return Err(KernelError::BadShape(format!(
            "{} values is not a multiple of 32",
            values.len()
        )));
    }
    let mut out = Vec::with_capacity(values.len() / QK * 34);
    for xb in values.chunks_exact(QK) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        for &v in xb {
            out.push(((v * id).round().clamp(-127.0, 127.0) as i8) as u8);
        }
    }
    Ok(out)
}

/// Encodes f32 values as GGUF Q4_0 blocks (f16 scale `d`, 16 bytes: element j in the
/// low nibble of byte j, element j+16 in the high nibble; value = `d·(q−8)`).
/// Scale choice: the element of largest magnitude maps to code 0 (`d = max/−8`).
pub fn encode_q4_0(values: &[f32]) -> Result<Vec<u8>, KernelError> {
    if !values.len().is_multiple_of(QK) {
        return Err(KernelError::BadShape(format!(
            "{} values is not a multiple of 32",
            values.len()
        )));
    }
    let mut out = Vec::with_capacity(values.len() / QK * 18);
    for xb in values.chunks_exact(QK) {
        let mut max = 0f32;
        for &v in xb {
            if v.abs() > max.abs() {
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        let code = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
        for j in 0..16 {
            out.push(code(xb[j]) | (code(xb[j + 16]) << 4));
        }
    }
    Ok(out)
}

/// MLX affine quantization of a row-major `[rows, cols]` f32 matrix: returns
/// (u32-packed codes as little-endian bytes, bf16 scales, bf16 biases), each per row,
/// with `w ≈ scale·q + bias` per group (min/max scheme).
#[allow(clippy::type_complexity)]
pub fn encode_mlx(
    bits: u8,
    group: usize,
    rows: usize,
    cols: usize,
    values: &[f32],
) -> Result<(Vec<u8>, Vec<u8>, Vec<u8>), KernelError> {
    if !(bits == 4 || bits == 8)
        || group == 0
        || !cols.is_multiple_of(group)
        || !(cols * bits as usize).is_multiple_of(32)
    {
        return Err(KernelError::BadShape(format!(
            "mlx bits {bits} group {group} cols {cols}"
        )));
    }
    crate::check_len("mlx values", rows * cols, values.len())?;
    let levels = ((1u32 << bits) - 1) as f32;
    let mut codes = vec![0u8; rows * cols * bits as usize / 8];
    let mut scales = Vec::with_capacity(rows * cols / group * 2);
    let mut biases = Vec::with_capacity(rows * cols / group * 2);
    for r in 0..rows {
        for g in 0..cols / group {
            let xs = &values[r * cols + g * group..r * cols + (g + 1) * group];
            let lo = xs.iter().fold(f32::INFINITY, |m, &v| m.min(v));
            let hi = xs.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let scale = bf16::from_f32(((hi - lo) / levels).max(1e-7));
            let bias = bf16::from_f32(lo);
            scales.extend_from_slice(&scale.to_bits().to_le_bytes());
            biases.extend_from_slice(&bias.to_bits().to_le_bytes());
            let (s, b) = (scale.to_f32(), bias.to_f32());
            for (j, &v) in xs.iter().enumerate() {
                let q = ((v - b) / s).round().clamp(0.0, levels) as u32;
                let e = r * cols + g * group + j; // element index in the bit stream
                let bit = e * bits as usize;
                codes[bit / 8] |= (q << (bit % 8)) as u8;
            }
        }
    }
    Ok((codes, scales, biases))
}
