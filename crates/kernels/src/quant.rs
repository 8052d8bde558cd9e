//! Block quantization helpers: activation quantization (internal) and encoders that
//! produce on-disk GGUF / MLX byte layouts from f32 values (for tests, benchmarks and
//! tools that write synthetic checkpoints).

use half::{bf16, f16};

use crate::KernelError;

pub use crate::layout::{ActRowOut, QK};

/// Quantizes one activation row to signed 8-bit blocks of 32 values into `out` with the
/// active table (every set computes the same codes, scales and sums as
/// [`quantize_act_row_reference`], bit for bit); `x.len()` must be a multiple of 32.
pub(crate) fn quantize_act_row(x: &[f32], out: ActRowOut<'_>) {
    let nb = x.len() / QK;
    assert!(out.q.len() >= nb * QK && out.d.len() >= nb && out.s.len() >= nb && out.qs.len() >= nb);
    // SAFETY: the active table was selected for this CPU; lengths checked above.
    unsafe { (crate::arch::active().quantize_act)(x, out) }
}

/// Scalar reference of the activation quantizer of the matrix products (see
/// [`quantize_activations`]).
pub use crate::arch::scalar::quantize_act_row as quantize_act_row_reference;

/// Public entry to the activation quantizer (dispatching like the matrix products), for
/// property tests: returns `(codes, scales, block sums, code sums)`.
pub fn quantize_activations(x: &[f32]) -> (Vec<i8>, Vec<f32>, Vec<f32>, Vec<i32>) {
    let nb = x.len() / QK;
    let (mut q, mut d, mut s, mut qs) =
        (vec![0; nb * QK], vec![0.0; nb], vec![0.0; nb], vec![0; nb]);
    let out = ActRowOut {
        q: &mut q,
        d: &mut d,
        s: &mut s,
        qs: &mut qs,
    };
    quantize_act_row(&x[..nb * QK], out);
    (q, d, s, qs)
}

/// Encodes `values` as GGUF blocks of 32 (`block_bytes` each, written by `block`), after
/// checking that they are whole blocks.
fn encode_blocks(
    values: &[f32],
    block_bytes: usize,
    mut block: impl FnMut(&[f32], &mut Vec<u8>),
) -> Result<Vec<u8>, KernelError> {
    if !values.len().is_multiple_of(QK) {
        return Err(KernelError::BadShape(format!(
            "{} values is not a multiple of 32",
            values.len()
        )));
    }
    let mut out = Vec::with_capacity(values.len() / QK * block_bytes);
    for xb in values.chunks_exact(QK) {
        block(xb, &mut out);
    }
    Ok(out)
}

/// Encodes f32 values (row-major, each row a multiple of 32 long) as GGUF Q8_0 blocks
/// (f16 scale `max|x|/127` + 32 signed codes, rounded half away from zero).
pub fn encode_q8_0(values: &[f32]) -> Result<Vec<u8>, KernelError> {
    encode_blocks(values, 34, |xb, out| {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        for &v in xb {
            out.push(((v * id).round().clamp(-127.0, 127.0) as i8) as u8);
        }
    })
}

/// Encodes f32 values as GGUF Q4_0 blocks (f16 scale `d`, 16 bytes: element j in the
/// low nibble of byte j, element j+16 in the high nibble; value = `d·(q−8)`).
/// Scale choice: the element of largest magnitude maps to code 0 (`d = max/−8`).
pub fn encode_q4_0(values: &[f32]) -> Result<Vec<u8>, KernelError> {
    encode_blocks(values, 18, |xb, out| {
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
    })
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
