//! Dequantization to f32 of stored tensors: plain dtypes, GGML blocks and MLX packed codes.

use half::{bf16, f16};

use super::DType;

/// Append the f32 values of `bytes` stored as `dt`.
pub(super) fn dequant_plain(
    dt: DType,
    bytes: &[u8],
    out: &mut Vec<f32>,
) -> Result<(), &'static str> {
    match dt {
        DType::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
        DType::F16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()),
        ),
        DType::Bf16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()),
        ),
        DType::F64 => out.extend(
            bytes
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("8")) as f32),
        ),
        DType::Bool | DType::U8 => out.extend(bytes.iter().map(|&b| b as f32)),
        DType::I64 => out.extend(
            bytes
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("8")) as f32),
        ),
        DType::Q8_0 => {
            for blk in bytes.chunks_exact(34) {
                let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
                out.extend(blk[2..].iter().map(|&q| q as i8 as f32 * d));
            }
        }
        DType::Q4_0 => {
            for blk in bytes.chunks_exact(18) {
                let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
                let qs = &blk[2..];
                out.extend(qs.iter().map(|&q| ((q & 0x0f) as i32 - 8) as f32 * d));
                out.extend(qs.iter().map(|&q| ((q >> 4) as i32 - 8) as f32 * d));
            }
        }
        _ => return Err("f32, f16, bf16, f64, q8_0, q4_0, bool, u8, i64"),
    }
    Ok(())
}

/// Dequantize MLX affine codes: `w = scale * q + bias` per group, codes little-endian in u32 words.
#[allow(clippy::too_many_arguments)]
pub(super) fn dequant_mlx(
    bits: u8,
    group: usize,
    rows: usize,
    cols: usize,
    w: &[u8],
    s: &[f32],
    b: &[f32],
    out: &mut Vec<f32>,
) {
    let words_per_row = cols * bits as usize / 32;
    let groups = cols / group;
    let mask = (1u32 << bits) - 1;
    let per_word = 32 / bits as usize;
    for r in 0..rows {
        for c in 0..cols {
            let wi = r * words_per_row + c / per_word;
            let word = u32::from_le_bytes(w[wi * 4..wi * 4 + 4].try_into().expect("4"));
            let q = (word >> ((c % per_word) * bits as usize)) & mask;
            let g = r * groups + c / group;
            out.push(s[g] * q as f32 + b[g]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn dequant_blocks() {
        let mut blk = f16::from_f32(0.5).to_le_bytes().to_vec();
        blk.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let mut out = Vec::new();
        dequant_plain(DType::Q8_0, &blk, &mut out).unwrap();
        assert_eq!(out[0], -8.0);
        assert_eq!(out[31], 7.5);
        let mut blk = f16::from_f32(2.0).to_le_bytes().to_vec();
        blk.extend((0..16).map(|i| (i as u8) | (((15 - i) as u8) << 4)));
        let mut out = Vec::new();
        dequant_plain(DType::Q4_0, &blk, &mut out).unwrap();
        assert_eq!(out[0], -16.0);
        assert_eq!(out[15], 14.0);
        assert_eq!(out[16], 14.0);
        assert_eq!(out[31], -16.0);
    }

    #[test]
    pub(super) fn dequant_mlx_packing() {
        // 4-bit: element 8i+j in bits [4j, 4j+4) of word i.
        let word: u32 = 0x7654_3210;
        let mut out = Vec::new();
        dequant_mlx(4, 8, 1, 8, &word.to_le_bytes(), &[2.0], &[1.0], &mut out);
        assert_eq!(out, vec![1.0, 3.0, 5.0, 7.0, 9.0, 11.0, 13.0, 15.0]);
        let word: u32 = 0x0403_0201;
        let mut out = Vec::new();
        dequant_mlx(8, 4, 1, 4, &word.to_le_bytes(), &[1.0], &[-1.0], &mut out);
        assert_eq!(out, vec![0.0, 1.0, 2.0, 3.0]);
    }
}
